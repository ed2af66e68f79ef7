"""Prompt-lookup and hybrid drafting: the n-gram index, the strategies, the loop
with them (greedy identity, KV invariants), and exactness under sampling."""

import random
import time

import pytest
from drafts import Lengths, ask, proposal
from noise import assert_a_tie
from test_exactness import RUNS, exact_first_two, goodness_of_fit
from test_speculative import PROMPTS

import specllama.engine.sampling as sampling_module
from specllama import (
    DraftProposed,
    Finished,
    InvalidParameterError,
    SamplingParams,
    SpeculativeDecoder,
    TargetToken,
    TokensAccepted,
)
from specllama.engine.drafting.base import Draft, Start
from specllama.engine.drafting.chain import DraftChain, Drafters, build_chain
from specllama.engine.drafting.lookup import LookupDrafter
from specllama.engine.drafting.model import ModelDrafter
from specllama.engine.drafting.ngram import NgramIndex
from specllama.engine.llama import Model
from specllama.engine.sampling import probabilities

GREEDY = SamplingParams(temperature=0.0)


# ------------------------------------------------------------------ the index


def reference_match(tokens: list[int], n_min: int, n_max: int, match_max: int = 64):
    """Brute force: the latest earlier occurrence of the longest suffix of n_min..n_max
    tokens (c = the position after it), and how many tokens before c agree with the
    end (counted up to match_max when the n_max-gram matched)."""
    L = len(tokens)
    for n in range(min(n_max, L), n_min - 1, -1):
        suffix = tokens[L - n :]
        for c in range(L - 1, n - 1, -1):  # follower position, latest first
            if tokens[c - n : c] == suffix:
                if n == n_max:
                    while n < min(match_max, c) and tokens[c - n - 1] == tokens[L - n - 1]:
                        n += 1
                return c, n
    return None


def reference_proposal(tokens: list[int], n_min: int, n_max: int, k: int) -> list[int]:
    """The k tokens after the reference match (repeating the period when the
    continuation runs into the end)."""
    found = reference_match(tokens, n_min, n_max)
    if found is None:
        return []
    seq = list(tokens)
    for j in range(k):
        seq.append(seq[found[0] + j])
    return seq[len(tokens) :]


def test_index_finds_the_longest_latest_match():
    ix = NgramIndex(2, 4)
    ix.extend([1, 2, 3, 4, 5, 1, 2])
    assert ix.match() == (2, 2)  # "1 2" occurred at 0..1, followed by position 2
    assert proposal(ix, 3) == [3, 4, 5]
    ix.extend([3, 9, 1, 2, 3])
    # "1 2 3" occurred twice before; the latest occurrence (positions 5..7) wins
    assert ix.match() == (8, 3)
    assert proposal(ix, 2) == [9, 1]
    ix.extend([7])
    assert ix.match() is None and proposal(ix, 5) == []
    assert proposal(ix, 0) == []


def test_a_repeating_pattern_keeps_repeating():
    ix = NgramIndex(2, 4)
    ix.extend([7, 8, 7, 8, 7])
    assert proposal(ix, 5) == [8, 7, 8, 7, 8]
    ix = NgramIndex(1, 3)
    ix.extend([5, 5])
    assert proposal(ix, 4) == [5, 5, 5, 5]


def test_a_long_match_is_measured_beyond_n_max():
    a = list(range(100, 130))
    ix = NgramIndex(2, 4)
    ix.extend(a + [7] + a)
    # the suffix repeats all 30 tokens of `a` (followed by 7 the first time)
    assert ix.match() == (30, 30)
    assert NgramIndex(2, 4, match_max=10).match() is None
    capped = NgramIndex(2, 4, match_max=10)
    capped.extend(a + [7] + a)
    assert capped.match() == (30, 10)


def test_one_token_is_not_a_match_by_default():
    ix = NgramIndex()
    ix.extend([1, 2, 3, 1])
    assert proposal(ix, 4) == []


@pytest.mark.parametrize("vocab", [3, 6, 50])
def test_index_agrees_with_brute_force_as_the_sequence_grows(vocab):
    rnd = random.Random(vocab)
    tokens = [rnd.randrange(vocab) for _ in range(40)]
    ix = NgramIndex(2, 5)
    ix.extend(tokens)
    for _ in range(300):
        assert ix.match() == reference_match(ix.tokens, 2, 5)
        for k in (1, 4, 9):
            assert proposal(ix, k) == reference_proposal(ix.tokens, 2, 5, k)
        # grow by 1-3 tokens, sometimes copying an earlier stretch
        if rnd.random() < 0.5:
            s = rnd.randrange(len(ix.tokens) - 3)
            new = ix.tokens[s : s + rnd.randint(1, 3)]
        else:
            new = [rnd.randrange(vocab) for _ in range(rnd.randint(1, 3))]
        ix.sync(ix.tokens + new)


def test_sync_is_incremental_and_survives_a_changed_sequence():
    ix = NgramIndex(2, 4)
    seq = [1, 2, 3, 4, 1, 2]
    ix.sync(seq)
    before = ix.insertions
    seq = seq + [3, 4, 5]
    ix.sync(seq)
    assert ix.insertions - before == 3 * 3  # 3 new tokens x 3 n-gram lengths
    assert ix.rebuilds == 0 and ix.tokens == seq
    ix.sync(seq)  # nothing new: nothing indexed
    assert ix.insertions - before == 9
    # A new generate() call with another prompt (or a shorter one): start over.
    other = [9, 8, 9, 8]
    ix.sync(other)
    assert ix.rebuilds == 1 and ix.tokens == other
    assert proposal(ix, 2) == reference_proposal(other, 2, 4, 2)
    ix.sync([9, 8])
    assert ix.rebuilds == 2 and ix.tokens == [9, 8] and ix.match() is None


def test_index_stays_fast_on_a_long_context():
    rnd = random.Random(0)
    n_min, n_max = 2, 8
    tokens = [rnd.randrange(1000) for _ in range(50_000)]
    ix = NgramIndex(n_min, n_max)
    t0 = time.perf_counter()
    ix.sync(tokens)
    build_s = time.perf_counter() - t0
    # Then 2000 rounds of the loop's pattern: propose, append a few tokens, settle.
    per_token = n_max - n_min + 1
    t0 = time.perf_counter()
    for i in range(2000):
        before = ix.insertions
        proposal(ix, 8)
        tokens.extend(tokens[1000 + i : 1000 + i + 3])  # copying: matches exist
        ix.sync(tokens)
        assert ix.insertions - before == 3 * per_token  # never a rescan
    rounds_s = time.perf_counter() - t0
    assert ix.rebuilds == 0
    assert ix.tokens == tokens and proposal(ix, 3)  # the copied stretch is found
    # Timing relative to the build, so a loaded machine matters little: 2000 rounds
    # of O(n_max) work each cost about as much as indexing 50k tokens once (a rescan
    # of the context per round would cost 2000 builds).
    assert rounds_s < 5 * build_s, (rounds_s, build_s)


def test_index_rejects_bad_lengths():
    for n_min, n_max in [(0, 3), (3, 2), (2, 2.5)]:
        with pytest.raises(InvalidParameterError, match="n-gram"):
            NgramIndex(n_min, n_max)


# ------------------------------------------------------------ the strategies


def test_lookup_draft_is_deterministic_q_and_respects_k():
    s = LookupDrafter(2, 4, cap_by_match=False)
    committed = [1, 2, 3, 4, 5, 6, 1, 2]
    lengths = Lengths(3)
    d = s.draft(ask(committed, lengths, params=SamplingParams()))
    assert d.tokens == [3, 4, 5] and d.qs == [None] * 3 and d.source == "lookup"
    assert d.origins == ["context"] * 3
    assert lengths.asked == ["lookup"]
    assert s.draft(ask(committed, 0)).tokens == []
    no_match = s.draft(ask([1, 2, 3], lengths))
    assert no_match.tokens == [] and no_match.qs == []
    assert lengths.asked == ["lookup"]  # no match: the policy is not even asked


def test_lookup_drafts_no_longer_than_the_match_warrants():
    """After a match of n tokens at most n - n_min + 1 are drafted."""
    ctx = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    k16 = {"lookup": 16}
    assert LookupDrafter(2, 4).draft(ask(ctx + [9, 1, 2], k16)).tokens == [3]  # n = 2
    assert LookupDrafter(2, 4).draft(ask(ctx + [9, 1, 2, 3], k16)).tokens == [4, 5]  # n = 3
    s = LookupDrafter(2, 4)
    d = s.draft(ask(ctx + [0] + ctx[:6], k16))  # n = 6 (measured past n_max)
    assert d.tokens == [7, 8, 9, 10, 0]
    assert s.draft(ask(ctx + [0] + ctx[:6], {"lookup": 2})).tokens == [7, 8]


class FakeModel:
    """A drafter that drafts k tokens of 42 and counts what it was asked."""

    name = "model"
    decode_s = 0.0
    behind = 0

    def __init__(self):
        self.proposed = 0
        self.accepted = 0
        self.drafting = True

    def begin(self, start):
        pass

    def draft(self, a):
        k = a.choose("model")
        self.proposed += 1
        d = Draft()
        d.add([42] * k, [None] * k, "model")
        return d

    def accept(self, committed, alone_p=None):
        self.accepted += 1

    def end(self, committed):
        pass


def test_the_chain_asks_lookup_first_and_falls_back_to_the_model():
    model = FakeModel()
    chain = DraftChain([LookupDrafter(2, 4, cap_by_match=False), model])
    ks = {"lookup": 2, "model": 3}
    d = chain.draft(ask([1, 2, 3, 1, 2], ks))
    assert (d.tokens, d.source) == ([3, 1], "lookup")
    assert model.proposed == 0  # the model was not asked
    chain.accept([1, 2, 3, 1, 2, 3])
    d = chain.draft(ask([1, 2, 3, 1, 2, 3, 9], ks))  # no match
    assert (d.tokens, d.source, d.origins) == ([42] * 3, "model", ["model"] * 3)
    assert model.proposed == 1
    # the policy turned lookup off (k = 0): the model drafts even though a match exists
    d = chain.draft(ask([1, 2, 3, 1, 2], {"lookup": 0, "model": 2}))
    assert d.source == "model" and d.tokens == [42, 42]
    # a chain of lookup alone drafts nothing without a match
    assert DraftChain([LookupDrafter(2, 4)]).draft(ask([1, 2, 3, 9], ks)).tokens == []


def test_the_chain_stops_at_the_room_left():
    chain = DraftChain([LookupDrafter(2, 4, cap_by_match=False), FakeModel()])
    assert chain.draft(ask([1, 2, 3, 1, 2], 8, room=2)).tokens == [3, 1]
    assert chain.draft(ask([1, 2, 3, 1, 2], 8, room=0)).tokens == []


# ------------------------------------------------- the loop with tiny models


@pytest.fixture(scope="module")
def dec(tiny_target, tiny_draft):
    d = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=512, n_threads=1, p_min=0.0)
    yield d
    d.close()


@pytest.fixture(scope="module")
def dec_lookup(tiny_target):
    d = SpeculativeDecoder.load(tiny_target, "lookup", n_ctx=512, n_threads=1, p_min=0.0)
    yield d
    d.close()


def chain_of(names, dec):
    return build_chain(Drafters.parse(names) if names else Drafters(), model=dec.draft_model,
                       p_min=0.0, ends=dec.target.is_eog, shadow=True, archives=())


def test_drafters_by_name(dec, dec_lookup):
    only_model = chain_of(("model",), dec)
    assert [type(d) for d in only_model.drafters] == [ModelDrafter]
    assert [type(d) for d in chain_of(("lookup",), dec).drafters] == [LookupDrafter]
    hybrid = chain_of("hybrid", dec)
    assert [d.name for d in hybrid.drafters] == ["lookup", "model"]
    assert hybrid.drafters[0].feeds is hybrid.drafters[1]  # following: the model drafts
    fed = chain_of("lookup>model", dec)
    assert [d.name for d in fed.drafters] == ["lookup>model"]
    assert fed.drafters[0].feeder is not None and fed.drafters[0].feed == "verify"
    assert not chain_of((), dec_lookup)  # nobody drafts: the target alone
    # One rule with the command line and /set: the draft model needs a draft model.
    with pytest.raises(InvalidParameterError,
                       match="drafters lookup,model need a draft model"):
        chain_of("hybrid", dec_lookup)
    with pytest.raises(InvalidParameterError, match="drafters must be some of"):
        chain_of("ngram", dec)
    with pytest.raises(InvalidParameterError, match="one draft model at most"):
        chain_of(("model", "lookup>model"), dec)


def test_the_default_drafters_are_lookup_then_the_model(dec, tiny_target):
    """Lookup where the text repeats itself, the draft model elsewhere; without a draft
    model lookup alone, as on the command line (one rule: Drafters.default); () is the
    target alone."""
    assert dec.default_drafters == ("lookup", "model")
    sources = {e.source for e in dec.stream(REPETITIVE[1], max_tokens=40, sampling=GREEDY,
                                            draft_max=4) if isinstance(e, DraftProposed)}
    assert sources == {"lookup", "model"}
    alone = SpeculativeDecoder.load(tiny_target, n_ctx=256, n_threads=1)
    try:
        assert alone.default_drafters == ("lookup",) == Drafters.default("none")
        assert alone.generate(REPETITIVE[0], max_tokens=30, sampling=GREEDY,
                              draft_max=4).stats.drafted > 0
        assert alone.generate(REPETITIVE[0], max_tokens=8, draft_max=4,
                              drafters=()).stats.drafted == 0
    finally:
        alone.close()


def test_load_lookup_has_no_draft_model_and_drafts_by_lookup(dec_lookup):
    assert dec_lookup.draft is None and dec_lookup.default_drafters == ("lookup",)
    prompt = "a b c d e f g a b c d e f g a b c"
    res = dec_lookup.generate(prompt, max_tokens=30, sampling=GREEDY, draft_max=4)
    assert res.stats.drafted > 0
    plain = dec_lookup.generate(prompt, max_tokens=30, sampling=GREEDY, draft_max=4,
                                drafters=())
    assert plain.stats.drafted == 0 and plain.tokens == res.tokens


def test_bad_drafters_are_an_error(dec, tiny_target):
    with pytest.raises(InvalidParameterError, match="drafters must be some of"):
        dec.generate("x", drafters="ngram")
    with pytest.raises(InvalidParameterError, match="drafters must be some of"):
        SpeculativeDecoder.load(tiny_target, "lookup", drafters="both")
    with pytest.raises(InvalidParameterError, match="need a draft model"):
        SpeculativeDecoder.load(tiny_target, "lookup", drafters="model")


REPETITIVE = [
    "a b c d e f g a b c d e f g a b c",
    "the cat sat on the mat and the cat sat on the",
    "1 2 3 4 5 1 2 3 4 5 1 2",
    "hello world hello world hello world",
    "def f(x):\n    return x\n\ndef f(x):\n",
]


@pytest.mark.parametrize("mode", ["lookup", "hybrid", "lookup>model", "lookup,lookup>model"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_output_equals_target_alone(dec, tiny_target, mode, k):
    probe = Model(tiny_target, n_ctx=512, n_threads=1)
    sources = set()
    for prompt in PROMPTS + REPETITIVE:
        base = dec.generate(prompt, max_tokens=40, sampling=GREEDY, draft_max=0)
        spec_tokens, res = [], None
        # (the suffix cache would copy the run just made whole: tests/test_suffixcache.py)
        for ev in dec.stream(prompt, max_tokens=40, sampling=GREEDY, draft_max=k, drafters=mode,
                             draft_cache=False):
            if isinstance(ev, DraftProposed):
                sources.add(ev.source)
            if isinstance(ev, Finished):
                res = ev.result
        spec_tokens = res.tokens
        if spec_tokens == base.tokens:
            continue
        j = next(i for i, (a, b) in enumerate(zip(spec_tokens, base.tokens)) if a != b)
        assert_a_tie(probe, dec.tokenize(prompt), base.tokens[:j], f"{mode} {prompt!r} k={k}")
    probe.close()
    assert sources == {"lookup": {"lookup"}, "hybrid": {"lookup", "model"},
                       "lookup>model": {"model"}}.get(mode, {"lookup", "model"})


class Guesses:
    """A feeder that guesses what follows from a list of expected tokens (+ `shift`)."""

    def __init__(self, prompt, expected, shift=0):
        self.text, self.shift = list(prompt) + list(expected), shift

    def splices(self):
        return False

    def agreed(self, tokens, k):
        return [], "context"

    def peek(self, context, k):
        n = len(context)
        return [t + self.shift for t in self.text[n : n + k]]


@pytest.mark.parametrize("shift", [0, 1])
def test_a_model_fed_guesses_drafts_what_it_would_alone(dec, shift):
    """Greedy, the model checking guesses draws its own argmax at every row: the draft is
    the same with right guesses (shift 0) or wrong ones (1), but each right guess costs no
    decode of its own."""
    prompt = dec.tokenize(REPETITIVE[0])

    def run(feeder):
        dec.reset()
        drafter = ModelDrafter(dec.draft_model, feeder=feeder, feed="verify")
        drafter.begin(Start(prompt, True, Lengths(6)))
        before = dec.draft.decode_calls
        tokens = drafter.draft(ask(prompt, 6)).tokens
        return tokens, dec.draft.decode_calls - before

    alone, calls_alone = run(None)
    fed, calls_fed = run(Guesses(prompt, alone, shift))
    assert fed == alone and len(alone) == 6
    if shift == 0:
        assert calls_fed == 2 < calls_alone  # the catch-up, then one batch: all six
    else:
        assert calls_fed == calls_alone  # every guess wrong: one decode per token still
    dec.reset()


def test_lookup_mode_never_touches_the_draft_model(dec):
    before = dec.draft.tokens_evaluated
    t_before = dec.target.tokens_evaluated
    res = dec.generate(REPETITIVE[0], max_tokens=40, sampling=GREEDY, draft_max=4,
                       drafters="lookup")
    assert res.stats.drafted > 0 and res.stats.draft_s == 0.0
    assert dec.draft.tokens_evaluated == before
    # and the target evaluates nothing twice: the prompt, then one pass per round
    evaluated = dec.target.tokens_evaluated - t_before
    assert evaluated == res.prompt_tokens - 1 + res.stats.target_steps + res.stats.drafted


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_hybrid_kv_invariants_after_every_round(dec, temperature):
    prompt = dec.tokenize(REPETITIVE[1])
    committed = list(prompt)
    sampling = SamplingParams(temperature=temperature, seed=5)
    sources = []
    for event in dec.stream(prompt, max_tokens=80, sampling=sampling, draft_max=5,
                            drafters="hybrid"):
        if isinstance(event, DraftProposed):
            sources.append(event.source)
        elif isinstance(event, TokensAccepted):
            committed += event.tokens
        elif isinstance(event, TargetToken):
            committed.append(event.token)
            assert dec.target.cached == committed[:-1]
            assert dec.target.pos_max() == len(committed) - 2
            # the draft model's cache is a prefix of committed[:-1] (lagging after
            # lookup rounds, caught up when it drafts next)
            d = dec.draft.cached
            assert d == committed[: len(d)] and len(d) <= len(committed) - 1
            assert dec.draft.pos_max() == len(d) - 1
        elif isinstance(event, Finished):
            assert event.result.tokens == committed[len(prompt) :]
    assert "lookup" in sources


def test_keep_cache_with_lookup(dec_lookup):
    """The chat REPL pattern: a second call extends the first's context."""
    first = dec_lookup.generate(REPETITIVE[2], max_tokens=10, sampling=GREEDY, draft_max=3)
    prompt2 = dec_lookup.tokenize(REPETITIVE[2]) + first.tokens + dec_lookup.tokenize(" 1 2")[1:]
    warm = dec_lookup.generate(prompt2, max_tokens=20, sampling=GREEDY, draft_max=3,
                               keep_cache=True)
    n_first = len(dec_lookup.tokenize(REPETITIVE[2]))
    assert warm.stats.prompt_reused == n_first + len(first.tokens) - 1
    cold = dec_lookup.generate(prompt2, max_tokens=20, sampling=GREEDY, draft_max=0)
    assert warm.tokens == cold.tokens


# ------------------------------------------------------- exactness, sampled

LOOKUP_BASES = ["The quick brown fox", "the cat sat on the", "Once upon a time", "Hello world",
                "I see the dog", "a b c d"]


def lookup_prompt(dec, probe: Model, params: SamplingParams) -> tuple[list[int], float]:
    """A prompt whose last tokens occurred before: base + the target's greedy
    continuation of it + " and" + base. Lookup then proposes that continuation;
    of the candidate bases, take the one whose first proposed token has target
    probability nearest 1/2, so both acceptance and rejection happen often."""
    best = None
    sep = dec.tokenize(" and")[-1:]
    for text in LOOKUP_BASES:
        base = dec.tokenize(text)
        cont = dec.generate(base, max_tokens=3, sampling=GREEDY, draft_max=0).tokens
        if len(cont) < 3 or any(probe.is_eog(t) for t in cont):
            continue
        prompt = base + cont + sep + base[1:]
        ix = NgramIndex()
        ix.extend(prompt)
        if not proposal(ix, 2):
            continue
        d1 = proposal(ix, 1)[0]
        probe.clear()
        probe.decode(prompt, "last")
        p = float(probabilities(probe.logits_row(-1), params)[d1])
        probe.clear()
        if best is None or abs(p - 0.5) < abs(best[1] - 0.5):
            best = (prompt, p)
    assert best is not None and 0.05 < best[1] < 0.95, best
    return best


def empirical_first_two_of_three(dec, prompt, params, mode, runs: int = RUNS):
    """Like test_exactness.empirical_first_two, but generating 3 tokens so that the
    first round drafts 2 (both draft positions go through the acceptance rule);
    also counts drafts by source."""
    counts: dict = {}
    drafted = {"lookup": 0, "model": 0}
    accepted = 0
    for seed in range(runs):
        s = SamplingParams(params.temperature, params.top_k, params.top_p, params.min_p, seed)
        result = None
        # keep_cache: the prompt stays in both caches between runs (the same start state,
        # as test_exactness.empirical_first_two keeps it; half a run's time otherwise)
        for ev in dec.stream(prompt, max_tokens=3, sampling=s, draft_max=4, drafters=mode,
                             keep_cache=True):
            if isinstance(ev, DraftProposed):
                drafted[ev.source] += len(ev.tokens)
            elif isinstance(ev, Finished):
                result = ev.result
        accepted += result.stats.accepted
        toks = result.tokens
        key = (toks[0], toks[1] if len(toks) > 1 else None)
        counts[key] = counts.get(key, 0) + 1
    return counts, drafted, accepted


@pytest.fixture(scope="module")
def probe(tiny_target):
    m = Model(tiny_target, n_ctx=256, n_threads=1)
    yield m
    m.close()


STAT_CASES = {
    "lookup, temperature 0.7": ("lookup", SamplingParams(temperature=0.7)),
    "lookup, temperature 1.3 top-k 8": ("lookup", SamplingParams(temperature=1.3, top_k=8)),
    "hybrid, top-p 0.9": ("hybrid", SamplingParams(temperature=1.0, top_p=0.9)),
}


@pytest.mark.parametrize("name", list(STAT_CASES))
def test_first_two_tokens_follow_the_target_distribution(dec, probe, name):
    mode, params = STAT_CASES[name]
    prompt, _ = lookup_prompt(dec, probe, params)
    exact = exact_first_two(probe, prompt, params)
    counts, drafted, accepted = empirical_first_two_of_three(dec, prompt, params, mode)
    # the rule was really exercised: lookup drafts proposed, some accepted, some not
    assert drafted["lookup"] >= RUNS
    assert 0.05 * RUNS < accepted < sum(drafted.values())
    if mode == "hybrid":
        assert drafted["model"] > 0  # after a rejection, the model drafts the next round
    pvalue = goodness_of_fit(counts, exact)
    assert pvalue > 1e-3, f"{name}: p-value {pvalue:.2e}"


def test_the_test_rejects_a_wrong_lookup_rule(dec, probe, monkeypatch):
    """Accepting every lookup token is not the target's distribution, and the test sees it."""
    params = SamplingParams(temperature=0.7)
    prompt, _ = lookup_prompt(dec, probe, params)
    exact = exact_first_two(probe, prompt, params)
    monkeypatch.setattr(sampling_module, "acceptance_probability", lambda p, q, d: 1.0)
    # chi2 ~3,400 over 27 cells with RUNS: a quarter of them rejects it (chi2 ~880)
    counts, _, _ = empirical_first_two_of_three(dec, prompt, params, "lookup", RUNS // 4)
    for key in counts:
        exact.setdefault(key, 1e-12)
    assert goodness_of_fit(counts, exact) < 1e-6


# ------------------------------------------------------ the real model (slow)


@pytest.mark.slow
def test_lookup_on_the_real_model_copy_prompts(smollm2_path):
    """SmolLM2 greedily rewriting a given text: lookup output is the target's own,
    and most lookup drafts are accepted (the copy-heavy bench prompts do copy)."""
    import json
    from importlib import resources

    lines = resources.files("specllama").joinpath("prompts/copy.jsonl").read_text("utf-8")
    prompts = {p["id"]: p["prompt"] for p in map(json.loads, lines.splitlines()) if p}
    d = SpeculativeDecoder.load(smollm2_path, "lookup", n_ctx=1024, n_threads=2, p_min=0.0)
    probe = Model(smollm2_path, n_ctx=1024, n_threads=2)
    try:
        for pid in ("copy-text-replace",):
            msg = [{"role": "user", "content": prompts[pid]}]
            prompt = d.target.tokenize_chat(d.target.format_chat(msg))
            base = d.generate(prompt, max_tokens=96, sampling=GREEDY, draft_max=0)
            spec = d.generate(prompt, max_tokens=96, sampling=GREEDY, draft_max=8)
            if spec.tokens != base.tokens:
                j = next(i for i, (a, b) in enumerate(zip(spec.tokens, base.tokens)) if a != b)
                assert_a_tie(probe, prompt, base.tokens[:j], pid)
            # How much the model copies is its own (and its CPU's) business; that lookup
            # drafts were proposed, some kept, and fewer target steps taken is ours.
            assert spec.stats.drafted > 0 and spec.stats.accepted > 0, pid
            assert spec.stats.target_steps < base.stats.target_steps, pid
    finally:
        probe.close()
        d.close()
