"""Statistical proof that speculative sampling keeps the target's distribution.

For a fixed prompt, the exact joint distribution of the first two generated tokens
is computed from the target's own logits; thousands of seeded speculative runs
must match it (chi-square), and the same test must reject a deliberately wrong
acceptance rule, which shows it has the power to catch a bug.
"""

import math

import numpy as np
import pytest
from drafts import drafting_ahead

import specllama.engine.sampling as sampling_module
from specllama import Drafters, DraftProposed, Finished, SamplingParams, SpeculativeDecoder
from specllama.engine.llama import Model
from specllama.engine.loop.lengths import FixedDraftLength
from specllama.engine.sampling import probabilities

RUNS = 3000
PROMPT_TEXT = "the cat sat on the"


def chi2_pvalue(chi2: float, dof: int) -> float:
    """Upper tail of the chi-square distribution (Wilson–Hilferty approximation)."""
    if dof <= 0:
        return 1.0
    z = ((chi2 / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def exact_first_two(model: Model, prompt: list[int], params: SamplingParams) -> dict:
    """P(x1, x2) for the target alone, from its logits."""
    model.clear()
    model.decode(prompt, "last")
    p1 = probabilities(model.logits_row(-1), params)
    joint = {}
    # Outcomes under the cutoffs are left out: at most 489 ids x 1e-7 of the mass at the
    # first token (1e-9 at the second), under 0.15 expected draws in 3,000 runs at worst;
    # one drawn fails the test as an outcome the target never gives, never passes it.
    for x1 in np.flatnonzero(p1 > 1e-7):
        x1 = int(x1)
        if model.is_eog(x1):
            joint[(x1, None)] = p1[x1]
            continue
        model.truncate(len(prompt))
        model.decode([x1], "last")
        p2 = probabilities(model.logits_row(-1), params)
        for x2 in np.flatnonzero(p2 > 1e-9):
            joint[(x1, int(x2))] = p1[x1] * p2[x2]
    model.clear()
    return joint


def empirical_first_two(dec, prompt, params: SamplingParams, draft_max: int,
                        runs: int = RUNS) -> dict:
    counts: dict = {}
    for seed in range(runs):
        s = SamplingParams(params.temperature, params.top_k, params.top_p, params.min_p, seed)
        # keep_cache: the prompt stays in both caches between runs (each run starts from
        # the same state, as a fresh one would; half the time of decoding it again)
        toks = dec.generate(prompt, max_tokens=2, sampling=s, draft_max=draft_max,
                            keep_cache=True).tokens
        key = (toks[0], toks[1] if len(toks) > 1 else None)
        counts[key] = counts.get(key, 0) + 1
    return counts


def goodness_of_fit(counts: dict, exact: dict) -> float:
    """Chi-square p-value; cells with expected count < 5 are pooled into one."""
    n = sum(counts.values())
    unseen = set(counts) - set(exact)
    assert not unseen, f"sampled pairs with zero target probability: {sorted(unseen)[:5]}"
    chi2, dof = 0.0, -1
    pooled_obs, pooled_exp = 0, 0.0
    for key, prob in exact.items():
        e, o = n * prob, counts.get(key, 0)
        if e >= 5:
            chi2 += (o - e) ** 2 / e
            dof += 1
        else:
            pooled_obs, pooled_exp = pooled_obs + o, pooled_exp + e
    if pooled_exp > 0:
        chi2 += (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-9)  # (0 / 0 guard only)
        dof += 1
    return chi2_pvalue(chi2, dof)


SETTINGS = {
    "temperature 0.7": SamplingParams(temperature=0.7),
    "temperature 1.3, top-k 8": SamplingParams(temperature=1.3, top_k=8),
    "top-p 0.8": SamplingParams(temperature=1.0, top_p=0.8),
    "min-p 0.05": SamplingParams(temperature=1.0, min_p=0.05),
}


@pytest.fixture(scope="module")
def setup(tiny_target, tiny_draft):
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=256, n_threads=1, p_min=0.0)
    probe = Model(tiny_target, n_ctx=256, n_threads=1)
    prompt = dec.tokenize(PROMPT_TEXT)
    yield dec, probe, prompt
    probe.close()
    dec.close()


@pytest.mark.parametrize("name", list(SETTINGS))
def test_first_two_tokens_follow_the_target_distribution(setup, name):
    dec, probe, prompt = setup
    params = SETTINGS[name]
    exact = exact_first_two(probe, prompt, params)
    counts = empirical_first_two(dec, prompt, params, draft_max=3)
    last = SamplingParams(params.temperature, params.top_k, params.top_p, params.min_p, RUNS - 1)
    assert dec.generate(prompt, max_tokens=2, sampling=last, draft_max=3).stats.drafted > 0
    pvalue = goodness_of_fit(counts, exact)
    assert pvalue > 1e-3, f"{name}: p-value {pvalue:.2e}"


def test_the_test_rejects_a_wrong_rule(setup, monkeypatch):
    """Accepting every draft token yields the draft's distribution, not the target's."""
    dec, probe, prompt = setup
    params = SETTINGS["temperature 0.7"]
    monkeypatch.setattr(sampling_module, "acceptance_probability", lambda p, q, d: 1.0)
    exact = exact_first_two(probe, prompt, params)
    # half the runs already reject it far below 1e-6 (chi2 ~2,200 over 60 cells with
    # RUNS, ~1,000 over 39 with half): the full test would see it all the more
    counts = empirical_first_two(dec, prompt, params, draft_max=3, runs=RUNS // 2)
    exact_with_unseen = dict(exact)
    for key in counts:
        exact_with_unseen.setdefault(key, 1e-12)
    assert goodness_of_fit(counts, exact_with_unseen) < 1e-6


def test_target_alone_follows_the_target_distribution(setup):
    """The baseline (draft_max=0) passes the same test: the sampler itself is right."""
    dec, probe, prompt = setup
    params = SETTINGS["top-p 0.8"]
    exact = exact_first_two(probe, prompt, params)
    counts = empirical_first_two(dec, prompt, params, draft_max=0)
    assert goodness_of_fit(counts, exact) > 1e-3


# ------------------------------------------------------------- long draft chains
#
# max_tokens=4 with draft_max=3: the first round drafts three tokens, so q_2 and q_3 (drawn
# after earlier drafts) go through the rule too. top_k=3 keeps the joint law of the first
# four tokens to at most 81 outcomes, each well populated.

CHAIN_RUNS = 4000
CHAIN_TOKENS = 4


def exact_joint(model: Model, prompt: list[int], params: SamplingParams, n: int) -> dict:
    """P(x1..xn) for the target alone, from its logits; a sequence that reaches
    end-of-generation early is a shorter key."""
    joint: dict = {}

    def walk(path: tuple, prob: float, p: np.ndarray) -> None:
        for x in np.flatnonzero(p > 1e-9):
            x = int(x)
            key, mass = (*path, x), prob * float(p[x])
            if model.is_eog(x) or len(key) == n:
                joint[key] = joint.get(key, 0.0) + mass
                continue
            model.truncate(len(prompt) + len(path))
            model.decode([x], "last")
            walk(key, mass, probabilities(model.logits_row(-1), params))

    model.clear()
    model.decode(prompt, "last")
    walk((), 1.0, probabilities(model.logits_row(-1), params))
    model.clear()
    return joint


def empirical_joint(dec, prompt, params: SamplingParams, n: int, runs: int,
                    spliced: list[int] | None = None, generate: int = 0,
                    ahead: list[int] | None = None, **kwargs):
    """Counts of the first n tokens over `runs` seeds, and the summed stats (`spliced`,
    when given, sums tokens spliced into model drafts and those accepted). `generate`:
    generate that many tokens (n at least) and count the first n, so that the last
    rounds counted are not cut short by the end of the generation."""
    counts: dict = {}
    drafted_at = [0] * 8
    accepted_at = [0] * 8
    for seed in range(runs):
        s = SamplingParams(params.temperature, params.top_k, params.top_p, params.min_p, seed)
        res = dec.generate(prompt, max_tokens=max(n, generate), sampling=s, keep_cache=True,
                           **kwargs)
        key = tuple(res.tokens[:n])
        counts[key] = counts.get(key, 0) + 1
        for i, (d, a) in enumerate(zip(res.stats.drafted_at, res.stats.accepted_at)):
            drafted_at[i] += d
            accepted_at[i] += a
        if spliced is not None:
            spliced[0] += res.stats.spliced
            spliced[1] += res.stats.spliced_accepted
        if ahead is not None:
            ahead[0] += res.stats.ahead
            ahead[1] += res.stats.ahead_accepted
    return counts, drafted_at, accepted_at


CHAIN_BASES = ["the cat sat on the", "The quick brown fox", "Once upon a time", "Hello world",
               "I see the dog", "a b c d", "one of the two", "this is it"]


def lookup_chain_parts(dec: SpeculativeDecoder, probe: Model, params: SamplingParams):
    """(base, continuation, separator): after base + its greedy continuation + the
    separator + base again, lookup finds the earlier base and proposes three tokens of
    the continuation. Of the candidates, the one whose three proposals the target finds
    likeliest in turn (each in (0.1, 0.95), so acceptance and rejection both happen at
    every draft position)."""
    from drafts import proposal

    from specllama.engine.drafting.ngram import NgramIndex

    greedy = SamplingParams(temperature=0.0)
    best, best_score = None, 0.0
    for text in CHAIN_BASES:
        base = dec.tokenize(text)
        cont = dec.generate(base, max_tokens=4, sampling=greedy, draft_max=0,
                            draft_cache=False).tokens
        if len(cont) < 4 or any(probe.is_eog(t) for t in cont):
            continue
        for sep in (" and", " the", " of", " I"):
            sep_tokens = dec.tokenize(sep)[1:]
            prompt = base + cont + sep_tokens + base[1:]
            index = NgramIndex()
            index.extend(prompt)
            drafts = proposal(index, 3)
            if len(drafts) < 3:
                continue
            probe.clear()
            probe.decode(prompt, "last")
            chance = []
            for n, d in enumerate(drafts):
                chance.append(float(probabilities(probe.logits_row(-1), params)[d]))
                if n < 2:
                    probe.decode([d], "last")
            probe.clear()
            score = min(chance)
            if max(chance) < 0.95 and score > max(best_score, 0.1):
                best, best_score = (base, cont, sep_tokens), score
    assert best is not None, "no base gives lookup chains both accepted and rejected"
    dec.draft_cache.forget_session()
    return best


def lookup_chain_prompt(dec: SpeculativeDecoder, probe: Model, params: SamplingParams):
    base, cont, sep = lookup_chain_parts(dec, probe, params)
    return base + cont + sep + base[1:]


CHAIN_CASES = {
    "model drafts, top-k 3": ("model", SamplingParams(temperature=1.0, top_k=3)),
    "lookup drafts, top-k 3": ("lookup", SamplingParams(temperature=1.0, top_k=3)),
    "hybrid drafts, top-k 3": ("hybrid", SamplingParams(temperature=1.0, top_k=3)),
    "model drafts, top-k 3, top-p 0.9, min-p 0.1": (
        "model", SamplingParams(temperature=1.0, top_k=3, top_p=0.9, min_p=0.1)
    ),
    # the hierarchical chain: lookups guess, the draft model checks the guesses
    "model drafts fed by lookups, top-k 3": (
        "lookup>model", SamplingParams(temperature=1.0, top_k=3)
    ),
}


def first_used_q_everywhere(verify):
    """A wrong rule only a chain can show: q_1 stands in for q_2 and q_3."""
    def wrong(p_rows, drafts, qs, rng, draw=None):
        return verify(p_rows, drafts, qs[:1] * len(qs), rng, draw)
    return wrong


WRONG_RULES = {
    # name -> (module attribute to replace, replacement factory)
    "q_1 used at every position": ("specllama.engine.loop.rounds.verify", first_used_q_everywhere),
    "residual that keeps the rejected token": (
        "specllama.engine.sampling.residual", lambda real: (lambda p, q, token: p)
    ),
    # the draft model keeps every lookup guess, as if it had drawn it from its q
    "every guess kept": (
        "specllama.engine.drafting.model.check_proposal",
        lambda real: (lambda p, token, rng: token),
    ),
}

#: Runs that show each wrong rule rejected (power only grows with more runs, so what a
#: part of CHAIN_RUNS rejects, the test rejects too). q_1 in place of q_2 and q_3 moves
#: the law a little (chi2 ~180 over ~55 cells with CHAIN_RUNS): all of them. The other
#: two move it far (chi2 ~2,500-3,500): a quarter of the runs gives chi2 ~700-900.
WRONG_RULE_RUNS = {"q_1 used at every position": CHAIN_RUNS,
                   "residual that keeps the rejected token": CHAIN_RUNS // 4,
                   "every guess kept": CHAIN_RUNS // 4}


@pytest.fixture(scope="module")
def chain_setup(tiny_target, tiny_draft):
    # Model drafts unless a case says otherwise (the prompt repeats itself for lookups).
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=256, n_threads=1, p_min=0.0,
                                  drafters="model")
    probe = Model(tiny_target, n_ctx=256, n_threads=1)
    prompt = lookup_chain_prompt(dec, probe, CHAIN_CASES["lookup drafts, top-k 3"][1])
    yield dec, probe, prompt
    probe.close()
    dec.close()


@pytest.mark.parametrize("name", list(CHAIN_CASES))
def test_draft_chains_follow_the_target_distribution(chain_setup, name):
    dec, probe, prompt = chain_setup
    mode, params = CHAIN_CASES[name]
    exact = exact_joint(probe, prompt, params, CHAIN_TOKENS)
    assert len(exact) <= 81
    counts, drafted_at, accepted_at = empirical_joint(
        dec, prompt, params, CHAIN_TOKENS, CHAIN_RUNS, draft_max=3, drafters=mode
    )
    # Third drafts were proposed thousands of times and sometimes accepted.
    assert drafted_at[2] > CHAIN_RUNS // 4 and accepted_at[2] > 50, (drafted_at, accepted_at)
    pvalue = goodness_of_fit(counts, exact)
    assert pvalue > 1e-3, f"{name}: p-value {pvalue:.2e}"


@pytest.mark.parametrize(
    ("name", "wrong"),
    [
        ("model drafts, top-k 3", "q_1 used at every position"),
        ("model drafts, top-k 3, top-p 0.9, min-p 0.1", "q_1 used at every position"),
        ("lookup drafts, top-k 3", "residual that keeps the rejected token"),
        ("hybrid drafts, top-k 3", "residual that keeps the rejected token"),
        ("model drafts fed by lookups, top-k 3", "every guess kept"),
    ],
)
def test_the_chain_test_rejects_a_wrong_rule(chain_setup, monkeypatch, name, wrong):
    import importlib

    dec, probe, prompt = chain_setup
    mode, params = CHAIN_CASES[name]
    exact = exact_joint(probe, prompt, params, CHAIN_TOKENS)
    where, make = WRONG_RULES[wrong]
    module_name, attr = where.rsplit(".", 1)
    module = importlib.import_module(module_name)
    monkeypatch.setattr(module, attr, make(getattr(module, attr)))
    counts, _, _ = empirical_joint(
        dec, prompt, params, CHAIN_TOKENS, WRONG_RULE_RUNS[wrong], draft_max=3, drafters=mode
    )
    for key in counts:
        exact.setdefault(key, 1e-12)
    assert goodness_of_fit(counts, exact) < 1e-6


@pytest.fixture(scope="module")
def cache_setup(tiny_target, tiny_draft):
    """Lookups from the suffix cache alone: the base and its continuation are a corpus
    document, the prompt only ends with the base; the cache keeps that document alone
    (the runs' own outputs are not remembered), so every draft comes from it."""
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=256, n_threads=1, p_min=0.0,
                                  drafters="lookup")
    probe = Model(tiny_target, n_ctx=256, n_threads=1)
    base, cont, sep = lookup_chain_parts(dec, probe, CHAIN_CASES["lookup drafts, top-k 3"][1])
    dec.draft_cache.corpus.add(base + cont, "corpus")
    dec.draft_cache.remember = lambda *args: None  # type: ignore[method-assign]
    yield dec, probe, base[:1] + sep + base[1:]
    probe.close()
    dec.close()


CACHE_CASES = {"cache drafts, top-k 3": ("lookup", SamplingParams(temperature=1.0, top_k=3)),
               "cache and model drafts, top-k 3": (
                   "hybrid", SamplingParams(temperature=1.0, top_k=3))}


@pytest.mark.parametrize("name", list(CACHE_CASES))
def test_suffix_cache_chains_follow_the_target_distribution(cache_setup, name):
    dec, probe, prompt = cache_setup
    mode, params = CACHE_CASES[name]
    exact = exact_joint(probe, prompt, params, CHAIN_TOKENS)
    # The first round drafts 3 tokens from the corpus (after a rejection a second round
    # drafts again: how many in all depends on the unseeded draws).
    first = dec.generate(prompt, max_tokens=4, draft_max=3, drafters=mode, sampling=params)
    assert first.stats.origin_drafted["corpus"] >= 3 and first.stats.drafted_at[2] >= 1
    counts, drafted_at, accepted_at = empirical_joint(
        dec, prompt, params, CHAIN_TOKENS, CHAIN_RUNS, draft_max=3, drafters=mode
    )
    assert drafted_at[2] > CHAIN_RUNS // 4 and accepted_at[2] > 50, (drafted_at, accepted_at)
    assert goodness_of_fit(counts, exact) > 1e-3


def test_the_suffix_cache_chain_test_rejects_a_wrong_rule(cache_setup, monkeypatch):
    dec, probe, prompt = cache_setup
    mode, params = CACHE_CASES["cache drafts, top-k 3"]
    exact = exact_joint(probe, prompt, params, CHAIN_TOKENS)
    monkeypatch.setattr("specllama.engine.sampling.residual", lambda p, q, token: p)
    runs = WRONG_RULE_RUNS["residual that keeps the rejected token"]  # chi2 ~2,500 at all
    counts, _, _ = empirical_joint(dec, prompt, params, CHAIN_TOKENS, runs, draft_max=3,
                                   drafters=mode)
    for key in counts:
        exact.setdefault(key, 1e-12)
    assert goodness_of_fit(counts, exact) < 1e-6


def test_greedy_with_the_suffix_cache_equals_the_target_alone(cache_setup):
    dec, _, prompt = cache_setup
    greedy = SamplingParams(temperature=0.0)
    alone = dec.generate(prompt, max_tokens=24, sampling=greedy, draft_max=0)
    cached = dec.generate(prompt, max_tokens=24, sampling=greedy, draft_max=3)
    assert cached.tokens == alone.tokens and cached.stats.origin_drafted.get("corpus", 0) > 0


@pytest.fixture(scope="module")
def follow_setup(tiny_target, tiny_draft):
    """Two earlier replies of one shape: the base, its continuation, and more after it
    (the cache keeps these two alone). The first round copies the continuation from
    both; from then on the text follows them, and the draft model's drafts take the
    tokens both replies have next for free (`ModelDrafter`, fed by the lookup)."""
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=256, n_threads=1, p_min=0.0,
                                  drafters="hybrid")
    probe = Model(tiny_target, n_ctx=256, n_threads=1)
    base, cont, sep = lookup_chain_parts(dec, probe, CHAIN_CASES["lookup drafts, top-k 3"][1])
    more = dec.generate(base + cont, max_tokens=12, draft_max=0, draft_cache=False,
                        sampling=SamplingParams(temperature=0.0)).tokens
    reply = base + cont + [t for t in more if not probe.is_eog(t)]
    dec.draft_cache.corpus.add(reply, "corpus")
    dec.draft_cache.corpus.add(reply, "corpus")
    dec.draft_cache.remember = lambda *args: None  # type: ignore[method-assign]
    # The prompt ends with 3 tokens of the base alone: the copy of one token it allows
    # (the shortest match) leaves the tokens after it to following.
    yield dec, probe, base[:1] + sep + base[-3:]
    probe.close()
    dec.close()


def test_drafts_following_earlier_replies_follow_the_target_distribution(follow_setup):
    dec, probe, prompt = follow_setup
    params = SamplingParams(temperature=1.0, top_k=3)
    exact = exact_joint(probe, prompt, params, CHAIN_TOKENS)
    spliced = [0, 0]
    counts, drafted_at, accepted_at = empirical_joint(
        dec, prompt, params, CHAIN_TOKENS, CHAIN_RUNS, spliced, generate=8, draft_max=3)
    # Spliced tokens were drafted hundreds of times, accepted and rejected.
    assert spliced[0] > 300 and 50 < spliced[1] < spliced[0], spliced
    assert drafted_at[2] > CHAIN_RUNS // 4 and accepted_at[2] > 50, (drafted_at, accepted_at)
    assert goodness_of_fit(counts, exact) > 1e-3


def test_the_following_test_rejects_a_spliced_token_given_the_models_q(
        follow_setup, monkeypatch):
    """A wrong rule only the splice can show: its tokens verified as if the draft model
    had drawn them from its last q, not put there whatever q says."""
    from specllama.engine.drafting.model import ModelDrafter

    dec, probe, prompt = follow_setup
    params = SamplingParams(temperature=1.0, top_k=3)
    exact = exact_joint(probe, prompt, params, CHAIN_TOKENS)
    real = ModelDrafter._spliced

    def wrong(self, run):
        free = real(self, run)
        draft = run.draft
        if free:
            q = draft.qs[len(draft.tokens) - len(free) - 1]
            draft.qs[len(draft.tokens) - len(free):] = [q] * len(free)
        return free

    monkeypatch.setattr(ModelDrafter, "_spliced", wrong)
    counts, _, _ = empirical_joint(dec, prompt, params, CHAIN_TOKENS, CHAIN_RUNS, generate=8,
                                   draft_max=3)
    for key in counts:
        exact.setdefault(key, 1e-12)
    assert goodness_of_fit(counts, exact) < 1e-6


def test_greedy_following_earlier_replies_equals_the_target_alone(follow_setup):
    dec, _, prompt = follow_setup
    greedy = SamplingParams(temperature=0.0)
    alone = dec.generate(prompt, max_tokens=24, sampling=greedy, draft_max=0)
    followed = dec.generate(prompt, max_tokens=24, sampling=greedy, draft_max=3)
    assert followed.tokens == alone.tokens


# ------------------------------------------------- vocabularies that differ at the end
#
# Pairs pass the compatibility check with sizes up to 128 apart (Qwen2.5 7B: 152,064 ids,
# 0.5B: 151,936). Here they differ by 64 each way, at temperature 1 with no top-k, so the
# ids only one model has carry real probability.

EXTRA = 64
UNEVEN_RUNS = 3000


@pytest.fixture(scope="module")
def uneven_pairs(tiny_model_factory):
    from conftest import DRAFT_NOISE

    return {
        "target has 64 more ids": (
            tiny_model_factory(seed=0, extra_tokens=EXTRA),
            tiny_model_factory(seed=0, noise=DRAFT_NOISE, noise_seed=1),
        ),
        "draft has 64 more ids": (
            tiny_model_factory(seed=0),
            tiny_model_factory(seed=0, noise=DRAFT_NOISE, noise_seed=1, extra_tokens=EXTRA),
        ),
    }


@pytest.mark.parametrize("case", ["target has 64 more ids", "draft has 64 more ids"])
def test_uneven_vocabularies_are_exact(uneven_pairs, case):
    target_path, draft_path = uneven_pairs[case]
    dec = SpeculativeDecoder.load(target_path, draft_path, n_ctx=256, n_threads=1, p_min=0.0)
    probe = Model(target_path, n_ctx=256, n_threads=1)
    try:
        n_target, n_draft = dec.target.n_vocab, dec.draft.n_vocab
        assert abs(n_target - n_draft) == EXTRA
        params = SamplingParams(temperature=1.0)
        prompt = dec.tokenize(PROMPT_TEXT)
        exact = exact_joint(probe, prompt, params, 2)
        counts: dict = {}
        drafted_beyond_target = 0
        for seed in range(UNEVEN_RUNS):
            s = SamplingParams(1.0, seed=seed)
            for ev in dec.stream(prompt, max_tokens=2, sampling=s, draft_max=3, keep_cache=True):
                if isinstance(ev, DraftProposed):
                    drafted_beyond_target += sum(t >= n_target for t in ev.tokens)
                elif isinstance(ev, Finished):
                    key = tuple(ev.result.tokens)
                    counts[key] = counts.get(key, 0) + 1
        pvalue = goodness_of_fit(counts, exact)
        assert pvalue > 1e-3, f"{case}: p-value {pvalue:.2e}"
        only_target = sum(c for key, c in counts.items() for t in key if t >= n_draft)
        if n_target > n_draft:
            # ids the draft lacks (q = 0) come from the residual, as often as p says
            expected = sum(p for key, p in exact.items() for t in key if t >= n_draft)
            assert only_target > 0.5 * expected * UNEVEN_RUNS > 20, (only_target, expected)
        else:
            # the draft proposed ids the target lacks; all were rejected, none came out
            assert drafted_beyond_target > 20 and only_target == 0
    finally:
        probe.close()
        dec.close()


@pytest.mark.parametrize("case", ["target has 64 more ids", "draft has 64 more ids"])
def test_uneven_vocabularies_greedy_equals_the_target_alone(uneven_pairs, case):
    target_path, draft_path = uneven_pairs[case]
    dec = SpeculativeDecoder.load(target_path, draft_path, n_ctx=256, n_threads=1, p_min=0.0)
    try:
        greedy = SamplingParams(temperature=0.0)
        for text in ("the cat sat on the", "Hello world", "Once upon a time"):
            alone = dec.generate(text, max_tokens=40, sampling=greedy, draft_max=0)
            for k in (1, 4):
                spec = dec.generate(text, max_tokens=40, sampling=greedy, draft_max=k)
                assert spec.tokens == alone.tokens, (text, k)
    finally:
        dec.close()


class _DeclinesEveryOtherLookup(FixedDraftLength):
    """Hybrid drafting as auto runs it where a lookup gives way to the draft model: every
    other lookup is declined and the model drafts that round instead."""

    def __init__(self) -> None:
        super().__init__(3)
        self.asked = {"lookup": 0, "model": 0}

    def choose(self, source="model", match=0):
        self.asked[source] += 1
        return 0 if source == "lookup" and self.asked[source] % 2 == 0 else 3


@pytest.mark.parametrize("wrong", [False, True], ids=["exact", "q_1 at every position"])
def test_hybrid_drafts_with_declined_lookups_follow_the_target_distribution(
        chain_setup, monkeypatch, wrong):
    """The same runs with a wrong rule for the model's drafts (q_1 for every position)
    must be rejected: the test can see a mistake on this path."""
    dec, probe, prompt = chain_setup
    mode, params = CHAIN_CASES["hybrid drafts, top-k 3"]
    if wrong:
        import specllama.engine.loop.rounds as decoder

        monkeypatch.setattr(decoder, "verify", first_used_q_everywhere(decoder.verify))
    policy = _DeclinesEveryOtherLookup()
    exact = exact_joint(probe, prompt, params, CHAIN_TOKENS)
    runs = 2 * CHAIN_RUNS  # half the rounds draft by lookup, which the wrong rule spares
    counts, _, _ = empirical_joint(dec, prompt, params, CHAIN_TOKENS, runs, draft_max=policy,
                                   drafters=mode)
    # lookups were declined often, and the model drafted in their place
    assert policy.asked["lookup"] > runs and policy.asked["model"] > runs // 2
    for key in counts:
        exact.setdefault(key, 1e-12)
    pvalue = goodness_of_fit(counts, exact)
    if wrong:
        assert pvalue < 1e-6, f"p-value {pvalue:.2e}"
    else:
        assert pvalue > 1e-3, f"p-value {pvalue:.2e}"


# ------------------------------------------ drafts whose length the draft's confidence sets


class _StopsWhenUnsure(FixedDraftLength):
    """Up to 3 drafts a round, each row's decision taken on the draft model's confidence
    there, as auto's stop rule does: below `low` stop, below `high` draw the token and end
    the draft with it, else go on."""

    def __init__(self, low: float = 0.0, high: float = 0.0) -> None:
        super().__init__(3)
        self.low, self.high = low, high
        self.steps = {"stop": 0, "last": 0, "more": 0}
        self.seen: list[float] = []

    def extend(self, j, confidence):
        self.seen.append(confidence)
        step = "stop" if confidence < self.low else "last" if confidence < self.high else "more"
        self.steps[step] += 1
        return step


def unsure_policy(dec, prompt, params) -> _StopsWhenUnsure:
    """Thresholds at the 30% and 60% points of the confidences a pilot run met, so each
    of the three decisions is taken often."""
    pilot = _StopsWhenUnsure()
    empirical_joint(dec, prompt, params, CHAIN_TOKENS, 100, draft_max=pilot)
    low, high = np.quantile(pilot.seen, [0.3, 0.6])
    return _StopsWhenUnsure(float(low), float(high))


def test_drafts_cut_by_the_draft_models_confidence_follow_the_target_distribution(chain_setup):
    dec, probe, prompt = chain_setup
    params = CHAIN_CASES["model drafts, top-k 3"][1]
    policy = unsure_policy(dec, prompt, params)
    exact = exact_joint(probe, prompt, params, CHAIN_TOKENS)
    counts, drafted_at, _ = empirical_joint(dec, prompt, params, CHAIN_TOKENS, CHAIN_RUNS,
                                            draft_max=policy)
    assert min(policy.steps.values()) > CHAIN_RUNS // 4, policy.steps
    assert drafted_at[2] > CHAIN_RUNS // 40  # some drafts still run to three tokens
    pvalue = goodness_of_fit(counts, exact)
    assert pvalue > 1e-3, f"p-value {pvalue:.2e}"


def test_the_confidence_test_rejects_a_cut_decided_by_the_drawn_token(chain_setup,
                                                                      monkeypatch):
    """The wrong rule: draw the token first and keep it only if q gave it enough
    probability. What is verified then no longer comes from q: the test must see it."""
    import specllama.engine.drafting.model as drafts

    dec, probe, prompt = chain_setup
    params = CHAIN_CASES["model drafts, top-k 3"][1]
    real_sample, own, drawn = drafts.sample, np.random.default_rng(0), [0]

    def peeking(logits, params, q=None):
        drawn[0] = real_sample(q, own)  # a true draw from q, made before the decision
        return float(q[drawn[0]])

    monkeypatch.setattr(drafts, "confidence", peeking)
    monkeypatch.setattr(drafts, "sample", lambda q, rng: drawn[0])
    policy = unsure_policy(dec, prompt, params)
    exact = exact_joint(probe, prompt, params, CHAIN_TOKENS)
    counts, _, _ = empirical_joint(dec, prompt, params, CHAIN_TOKENS, CHAIN_RUNS,
                                   draft_max=policy)
    for key in counts:
        exact.setdefault(key, 1e-12)
    assert goodness_of_fit(counts, exact) < 1e-6


def test_greedy_drafts_cut_by_confidence_equal_the_target_alone(chain_setup):
    """Greedy, the confidence is the draft model's raw softmax (q is one-hot): drafts
    that end on it give the target's own greedy text, token for token."""
    dec, _, _ = chain_setup
    greedy = SamplingParams(temperature=0.0)
    pilot = _StopsWhenUnsure()
    prompts = CHAIN_BASES[:6]
    for text in prompts:
        dec.generate(text, max_tokens=24, sampling=greedy, draft_max=pilot)
    low, high = np.quantile(pilot.seen, [0.3, 0.6])
    policy = _StopsWhenUnsure(float(low), float(high))
    for text in prompts:
        alone = dec.generate(text, max_tokens=24, sampling=greedy, draft_max=0).tokens
        assert dec.generate(text, max_tokens=24, sampling=greedy, draft_max=policy).tokens \
            == alone, text
    assert min(policy.steps.values()) > 10, policy.steps


# ------------------------------------------ model drafts that end at an end of generation


def test_a_model_draft_ends_with_a_token_that_ends_generation(chain_setup):
    """After the target's end-of-generation token nothing is ever used: the draft model
    stops there instead of drafting (and the target verifying) text past the end."""
    from drafts import ask

    from specllama.engine.drafting.model import ModelDrafter

    dec, _, prompt = chain_setup
    made = dec._chain(Drafters.parse("model"), SamplingParams(), 3, False, None,
                      None).drafters[0]
    assert isinstance(made, ModelDrafter) and made.ends(dec.target.eos)
    assert not made.ends(prompt[-1])
    plain = ModelDrafter(dec.draft_model)
    full = plain.draft(ask(prompt, 3))
    plain.accept(prompt)
    assert len(full.tokens) == 3
    first = full.tokens[0]
    ended = ModelDrafter(dec.draft_model, ends=lambda token: token == first)
    evaluated = dec.draft_model.tokens_evaluated
    draft = ended.draft(ask(prompt, 3))
    assert draft.tokens == [first]
    # Only the catch-up (the last committed token) was decoded, not the drawn token.
    assert dec.draft_model.tokens_evaluated - evaluated == 1
    ended.accept(prompt)


def test_drafts_that_end_after_a_drawn_token_follow_the_target_distribution(
        chain_setup, monkeypatch):
    """Ending a draft after a token, chosen by that token, is exact: each kept token still
    came from its q, and after the last one the target draws from its own p. Here the
    draft ends after the target's likeliest first token (as it would after an end of
    generation), which ends most rounds early, and the joint law must not move."""
    import specllama.engine.drafting.chain as chain

    dec, probe, prompt = chain_setup
    params = CHAIN_CASES["model drafts, top-k 3"][1]
    exact = exact_joint(probe, prompt, params, CHAIN_TOKENS)
    probe.clear()
    probe.decode(prompt, "last")
    stop_at = int(np.argmax(probe.logits_row(-1)))
    probe.clear()
    cuts = [0]

    def ends(token: int) -> bool:
        cuts[0] += token == stop_at
        return token == stop_at

    real = chain.ModelDrafter
    monkeypatch.setattr(chain, "ModelDrafter",
                        lambda model, p_min, **kw: real(model, p_min, **{**kw, "ends": ends}))
    counts, drafted_at, _ = empirical_joint(dec, prompt, params, CHAIN_TOKENS, CHAIN_RUNS,
                                            draft_max=3, drafters="model")
    assert cuts[0] > CHAIN_RUNS // 4, cuts
    assert drafted_at[2] > CHAIN_RUNS // 4  # and other drafts still run to three tokens
    pvalue = goodness_of_fit(counts, exact)
    assert pvalue > 1e-3, f"p-value {pvalue:.2e}"


# ------------------------------------------ a prompt left to the draft model


def test_a_prompt_left_to_the_draft_model_keeps_the_target_distribution(chain_setup):
    """Where the policy leaves the prompt to the draft model (auto, when catching up on
    it would not pay), its first draft decodes the whole prompt before drafting: the
    caches must stay right and the joint law of 4 tokens must not move."""
    from specllama.engine.loop.lengths import FixedDraftLength

    class LeavesThePrompt(FixedDraftLength):
        def may_draft(self, source="model", behind=0):
            return False

    dec, probe, prompt = chain_setup
    params = CHAIN_CASES["model drafts, top-k 3"][1]
    exact = exact_joint(probe, prompt, params, CHAIN_TOKENS)
    dec.draft_model.clear()
    stream = dec.stream(prompt, max_tokens=CHAIN_TOKENS, sampling=params,
                        draft_max=LeavesThePrompt(3), drafters="model")
    next(stream)  # the prompt is in the target's cache, none of it in the draft model's
    assert dec.draft_model.cached == []
    stream.close()
    counts: dict = {}
    drafted_at = [0] * 8
    for seed in range(CHAIN_RUNS):
        dec.draft_model.clear()  # each run's prompt is new to the draft model
        s = SamplingParams(params.temperature, params.top_k, params.top_p, params.min_p, seed)
        res = dec.generate(prompt, max_tokens=CHAIN_TOKENS, sampling=s, keep_cache=True,
                           draft_max=LeavesThePrompt(3), drafters="model")
        history = prompt + res.tokens
        assert dec.target.cached == history[:-1]
        assert dec.draft_model.cached == history[: len(dec.draft_model.cached)]
        key = tuple(res.tokens[:CHAIN_TOKENS])
        counts[key] = counts.get(key, 0) + 1
        drafted_at = [a + b for a, b in zip(drafted_at, res.stats.drafted_at)]
    assert drafted_at[2] > CHAIN_RUNS // 4, drafted_at
    pvalue = goodness_of_fit(counts, exact)
    assert pvalue > 1e-3, f"p-value {pvalue:.2e}"


# ------------------------------------------ drafts drawn ahead, on other threads


#: Each run starts and stops the drafting thread a few times: fewer runs than a chain's.
AHEAD_RUNS = 2000


@pytest.fixture
def ahead_setup(chain_setup, monkeypatch):
    """The chain pair with the draft model drafting ahead on a thread of its own while
    the target verifies (drafting/ahead.py), put back to taking turns afterwards. The
    target's decode is slowed to several of the draft's steps, as a laptop-class
    target's is, so that tokens are drawn ahead however busy the machine is."""
    dec, probe, prompt = chain_setup
    drafting_ahead(dec, monkeypatch)
    yield dec, probe, prompt
    dec.set_threads(1, 0)


def test_drafts_drawn_ahead_follow_the_target_distribution(ahead_setup):
    """With one token drafted a round, the second round's draft is the one drawn ahead
    whenever the first was accepted and the target's own token was the one drawn next:
    the joint law of 4 tokens must not move."""
    dec, probe, prompt = ahead_setup
    params = CHAIN_CASES["model drafts, top-k 3"][1]
    exact = exact_joint(probe, prompt, params, CHAIN_TOKENS)
    ahead = [0, 0]
    counts, _, _ = empirical_joint(dec, prompt, params, CHAIN_TOKENS, AHEAD_RUNS, generate=8,
                                   ahead=ahead, draft_max=1, drafters="model")
    assert ahead[0] > AHEAD_RUNS // 2 and 0 < ahead[1] < ahead[0], ahead
    pvalue = goodness_of_fit(counts, exact)
    assert pvalue > 1e-3, f"p-value {pvalue:.2e}"


def test_the_ahead_test_rejects_a_draw_that_is_not_from_q(ahead_setup, monkeypatch):
    """The wrong rule: tokens drawn ahead greedily, verified as if drawn from q."""
    import specllama.engine.drafting.ahead as ahead_module

    dec, probe, prompt = ahead_setup
    params = CHAIN_CASES["model drafts, top-k 3"][1]
    exact = exact_joint(probe, prompt, params, CHAIN_TOKENS)
    monkeypatch.setattr(ahead_module, "sample", lambda q, rng: int(np.argmax(q)))
    counts, _, _ = empirical_joint(dec, prompt, params, CHAIN_TOKENS, AHEAD_RUNS, generate=8,
                                   draft_max=1, drafters="model")
    for key in counts:
        exact.setdefault(key, 1e-12)
    assert goodness_of_fit(counts, exact) < 1e-6


def test_p_min_cuts_drafting_ahead_only_without_a_stop_rule(ahead_setup):
    """Drawn ahead, as drafted in turn, `p_min` binds a fixed draft length; a policy with
    a stop rule of its own (auto) judges the tokens drawn ahead itself."""
    from test_speculative import PauseThenDraft

    class OneWithItsOwnRule(PauseThenDraft):
        def choose(self, source="model", match=0):
            return 1

    dec, _, prompt = ahead_setup
    params = SamplingParams(temperature=1.0, seed=1)
    dec.p_min = 1.0  # no top token reaches it
    try:
        for _ in range(4):  # what is drawn ahead depends on the cores the thread gets
            ruled = dec.generate(prompt, max_tokens=40, sampling=params,
                                 draft_max=OneWithItsOwnRule(0), drafters="model")
            if ruled.stats.ahead > 0:
                break
        fixed = dec.generate(prompt, max_tokens=40, sampling=params, draft_max=1,
                             drafters="model")
    finally:
        dec.p_min = 0.0
    assert ruled.stats.ahead > 0
    assert fixed.stats.drafted == 0 and fixed.stats.ahead == 0


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_drafts_drawn_ahead_equal_the_target_alone(ahead_setup, k):
    dec, _, prompt = ahead_setup
    greedy = SamplingParams(temperature=0.0)
    alone = dec.generate(prompt, max_tokens=40, sampling=greedy, draft_max=0)
    for _ in range(4):  # what is drawn ahead depends on the cores the draft thread gets
        spec = dec.generate(prompt, max_tokens=40, sampling=greedy, draft_max=k,
                            drafters="model")
        assert spec.tokens == alone.tokens
        if spec.stats.ahead > 0:
            break
    assert spec.stats.ahead > 0  # drafts drawn ahead were proposed
    history = prompt + spec.tokens
    assert dec.target.cached == history[:-1]
    assert dec.draft_model.cached == history[: len(dec.draft_model.cached)]  # nothing left ahead
