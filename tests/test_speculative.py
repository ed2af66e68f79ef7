"""The round loop against real tiny llama.cpp models: greedy identity, KV invariants,
stopping rules, interruption, reuse."""

import numpy as np
import pytest
from noise import assert_a_tie, split_noise, tolerance

from specllama import (
    ContextOverflowError,
    DraftProposed,
    Finished,
    IncompatiblePairError,
    InvalidParameterError,
    SamplingParams,
    SpeculativeDecoder,
    TargetToken,
    TokensAccepted,
)
from specllama.engine.drafting.base import always_more
from specllama.engine.llama import Model
from specllama.engine.sampling import probabilities

GREEDY = SamplingParams(temperature=0.0)

PROMPTS = [
    "Hello world",
    "the cat sat on the",
    "Once upon a time",
    "1 2 3 4 5",
    "a b c d e f g",
    "def main():",
    "The quick brown fox",
    "of the of the of",
    "日本語のテキスト",
    "hello, world! 🐱",
    "x",
    "The answer is",
]


@pytest.fixture(scope="module")
def dec(tiny_target, tiny_draft):
    d = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=512, n_threads=1, p_min=0.0,
                                drafters="model")
    yield d
    d.close()


@pytest.fixture(scope="module")
def dec_same(tiny_target, tiny_draft_same):
    d = SpeculativeDecoder.load(tiny_target, tiny_draft_same, n_ctx=512, n_threads=1, p_min=0.0,
                                drafters="model")
    yield d
    d.close()


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_output_equals_target_alone(dec, tiny_target, k):
    probe = Model(tiny_target, n_ctx=512, n_threads=1)
    for prompt in PROMPTS:
        base = dec.generate(prompt, max_tokens=40, sampling=GREEDY, draft_max=0)
        spec = dec.generate(prompt, max_tokens=40, sampling=GREEDY, draft_max=k)
        if spec.tokens == base.tokens:
            continue
        # Divergence is allowed only where the target's top two logits tie within float noise.
        j = next(i for i, (a, b) in enumerate(zip(spec.tokens, base.tokens)) if a != b)
        assert_a_tie(probe, dec.tokenize(prompt), base.tokens[:j], f"{prompt!r} k={k}")
    probe.close()


def test_target_alone_is_plain_decoding(dec, tiny_target):
    """draft_max=0 equals a hand-written greedy loop over the target."""
    model = Model(tiny_target, n_ctx=512, n_threads=1)
    tokens = dec.tokenize("the cat sat on the")
    model.decode(tokens, "last")
    expected = []
    for _ in range(20):
        t = int(np.argmax(model.logits_row(-1)))
        expected.append(t)
        if model.is_eog(t):
            break
        model.decode([t], "last")
    res = dec.generate("the cat sat on the", max_tokens=20, sampling=GREEDY, draft_max=0)
    assert res.tokens == expected
    model.close()


def test_identical_draft_is_always_accepted(dec_same):
    for temperature in (0.0, 0.8, 1.5):
        res = dec_same.generate(
            "Once upon a time",
            max_tokens=60,
            sampling=SamplingParams(temperature=temperature, seed=3),
            draft_max=4,
        )
        if res.stats.drafted:
            assert res.stats.acceptance_rate == 1.0, temperature
        assert res.stats.drafted > 0


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_kv_invariants_after_every_round(dec, temperature):
    prompt = dec.tokenize("the cat sat on the")
    committed = list(prompt)
    sampling = SamplingParams(temperature=temperature, seed=11)
    for event in dec.stream(prompt, max_tokens=80, sampling=sampling, draft_max=5):
        if isinstance(event, DraftProposed):
            continue
        if isinstance(event, TokensAccepted):
            committed += event.tokens
            continue
        if isinstance(event, TargetToken):
            committed.append(event.token)
            # After the round: the target holds exactly committed[:-1]; the draft a
            # prefix of it, behind by at most one token (the last accepted draft,
            # which it decodes together with the next round's first token).
            assert dec.target.cached == committed[:-1]
            assert dec.target.pos_max() == len(committed) - 2
            d = dec.draft.cached
            assert d == committed[: len(d)] and len(committed) - 2 <= len(d) <= len(committed) - 1
            assert dec.draft.pos_max() == len(d) - 1
        if isinstance(event, Finished):
            assert event.result.tokens == committed[len(prompt) :]


def test_nothing_is_evaluated_twice_by_the_target(dec):
    before = dec.target.tokens_evaluated
    res = dec.generate("Once upon a time", max_tokens=50, sampling=GREEDY, draft_max=4)
    evaluated = dec.target.tokens_evaluated - before
    # prompt minus last token, then one pass of [last, d1..dk] per round
    assert evaluated == res.prompt_tokens - 1 + res.stats.target_steps + res.stats.drafted


def test_stats_add_up(dec):
    res = dec.generate(
        "Once upon a time", max_tokens=64, sampling=SamplingParams(seed=1), draft_max=4
    )
    s = res.stats
    assert s.tokens == len(res.tokens) == 64 or res.finish_reason == "eos"
    assert s.accepted <= s.drafted
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert s.tokens_per_step == pytest.approx(s.tokens / s.target_steps)
    assert sum(s.accepted_at) == s.accepted and sum(s.drafted_at) == s.drafted
    assert s.generate_s >= s.draft_s + s.target_s > 0
    assert 0 <= s.overhead_share < 1
    assert s.tokens_per_s == pytest.approx(s.tokens / s.generate_s)


@pytest.mark.parametrize("k", [0, 3, 8])
def test_never_more_than_max_tokens(dec, k):
    for n in (1, 2, 3, 7):
        sampling = SamplingParams(seed=n)
        res = dec.generate("Hello world", max_tokens=n, sampling=sampling, draft_max=k)
        assert len(res.tokens) <= n
        if res.finish_reason == "length":
            assert len(res.tokens) == n


def test_same_seed_same_output(dec):
    kw = dict(max_tokens=30, sampling=SamplingParams(temperature=1.0, seed=42), draft_max=3)
    assert dec.generate("Hello world", **kw).tokens == dec.generate("Hello world", **kw).tokens
    other = dec.generate("Hello world", max_tokens=30, sampling=SamplingParams(1.0, seed=43),
                         draft_max=4)
    assert other.tokens != dec.generate("Hello world", **kw).tokens


def test_stop_string_cuts_text(dec):
    full = dec.generate("Once upon a time", max_tokens=40, sampling=GREEDY, draft_max=4)
    assert len(full.text) > 6
    stop = full.text[3:6]
    res = dec.generate("Once upon a time", max_tokens=40, sampling=GREEDY, draft_max=4, stop=[stop])
    assert res.finish_reason == "stop"
    assert res.text == full.text[: full.text.find(stop)]


def test_streamed_text_equals_result_text(dec):
    pieces = []
    result = None
    for ev in dec.stream("hello, world! 🐱", max_tokens=60, sampling=SamplingParams(seed=5),
                         draft_max=4):
        if isinstance(ev, (TokensAccepted, TargetToken)):
            pieces.append(ev.text)
        elif isinstance(ev, Finished):
            result = ev.result
        elif hasattr(ev, "text"):
            pieces.append(ev.text)
    assert "".join(pieces) == result.text
    assert result.text == dec.target.detokenize(
        [t for t in result.tokens if not dec.target.is_eog(t)]
    )


def test_closing_the_stream_early_leaves_consistent_caches(dec):
    prompt = dec.tokenize("Once upon a time")
    committed = list(prompt)
    stream = dec.stream(prompt, max_tokens=100, sampling=SamplingParams(seed=2), draft_max=6)
    for ev in stream:
        if isinstance(ev, TokensAccepted):
            committed += ev.tokens
        if isinstance(ev, TargetToken):
            committed.append(ev.token)
        if isinstance(ev, DraftProposed) and len(committed) > len(prompt) + 10:
            break  # mid-round: drafts proposed, not yet verified
    stream.close()
    assert dec.target.cached == committed[:-1]
    assert dec.draft.cached == committed[: len(dec.draft.cached)]
    assert stream.result.finish_reason == "interrupted"
    # and the decoder still works, identically to a fresh one
    a = dec.generate("Hello world", max_tokens=20, sampling=GREEDY, draft_max=3)
    b = dec.generate("Hello world", max_tokens=20, sampling=GREEDY, draft_max=0)
    assert a.tokens == b.tokens


def test_keep_cache_reuses_the_common_prefix(dec):
    first = dec.generate("the cat sat on the", max_tokens=10, sampling=GREEDY, draft_max=3)
    prompt2 = dec.tokenize("the cat sat on the") + first.tokens + dec.tokenize(" of", )[1:]
    before = dec.target.tokens_evaluated
    res = dec.generate(prompt2, max_tokens=5, sampling=GREEDY, draft_max=3, keep_cache=True)
    assert res.stats.prompt_reused >= len(prompt2) - 3
    evaluated = dec.target.tokens_evaluated - before
    fresh = len(prompt2) - 1 - res.stats.prompt_reused
    assert evaluated == fresh + res.stats.target_steps + res.stats.drafted
    cold = dec.generate(prompt2, max_tokens=5, sampling=GREEDY, draft_max=3)
    assert cold.tokens == res.tokens


def test_context_full_stops_generation(tiny_target, tiny_draft):
    d = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=32, n_threads=1, p_min=0.0)
    res = d.generate("Hello world", max_tokens=500, sampling=GREEDY, draft_max=4)
    assert res.finish_reason in ("context", "eos")
    # llama.cpp rounds small contexts up; the decoder reports what it really got
    assert res.prompt_tokens + len(res.tokens) <= d.n_ctx + 1
    with pytest.raises(ContextOverflowError, match=f"context window holds {d.n_ctx}"):
        d.generate("hello " * d.n_ctx, max_tokens=5)
    d.close()


def test_bad_arguments(dec):
    with pytest.raises(InvalidParameterError, match="max_tokens"):
        dec.generate("x", max_tokens=-1)  # (0: the prompt only, as /infill's warm-up asks)
    with pytest.raises(InvalidParameterError, match="draft_max"):
        dec.generate("x", draft_max=-1)
    with pytest.raises(InvalidParameterError, match="draft_max"):
        dec.generate("x", draft_max=1000)
    with pytest.raises(InvalidParameterError, match="empty"):
        dec.generate([])


def test_incompatible_pair_names_both_files_and_the_difference(tiny_target, tiny_other_vocab):
    with pytest.raises(IncompatiblePairError) as err:
        SpeculativeDecoder.load(tiny_target, tiny_other_vocab, n_ctx=128)
    msg = str(err.value)
    assert tiny_target.name in msg and tiny_other_vocab.name in msg
    assert "\n" not in msg


def test_target_alone_without_draft_model(tiny_target):
    """No draft model: lookup drafts, as on the command line; drafters=() (or draft_max 0)
    is the target alone."""
    d = SpeculativeDecoder.load(tiny_target, None, n_ctx=256, p_min=0.0)
    assert d.default_drafters == ("lookup",)
    for alone in ({"drafters": ()}, {"draft_max": 0}):
        res = d.generate("Hello world", max_tokens=10, sampling=GREEDY,
                         **{"draft_max": 4, **alone})
        assert res.stats.drafted == 0 and res.stats.target_steps == len(res.tokens)
    d.close()


# ------------------------------------------------------------------- deferred draft prompt


def test_target_alone_never_evaluates_the_draft_model(dec):
    before = dec.draft.tokens_evaluated
    res = dec.generate("Once upon a time there was a", max_tokens=12, sampling=GREEDY,
                       draft_max=0)
    assert dec.draft.tokens_evaluated == before
    assert dec.target.cached == dec.tokenize("Once upon a time there was a") + res.tokens[:-1]


def test_a_lagging_draft_model_catches_up_when_it_drafts(dec):
    """A conversation whose first turns ran without drafting: the draft model's cache
    holds nothing of it, catches up at its first draft, and the output is still the
    target's (greedy identity) with both caches consistent."""
    prompt = dec.tokenize("The quick brown fox")
    first = dec.generate(prompt, max_tokens=10, sampling=GREEDY, draft_max=0)
    assert dec.draft.cached == []  # reset at the start of the call, never filled
    history = prompt + first.tokens + dec.tokenize(" and then")[1:]
    before = dec.draft.tokens_evaluated
    spec = dec.generate(history, max_tokens=20, sampling=GREEDY, draft_max=3, keep_cache=True)
    assert dec.draft.tokens_evaluated - before >= len(history) - 1  # it caught up
    base = dec.generate(history, max_tokens=20, sampling=GREEDY, draft_max=0)
    assert spec.tokens == base.tokens
    spec = dec.generate(history, max_tokens=20, sampling=GREEDY, draft_max=3, keep_cache=True)
    committed = history + spec.tokens
    assert dec.target.cached == committed[:-1]
    assert dec.draft.cached == committed[: len(dec.draft.cached)]


def test_fixed_k_evaluates_the_draft_prompt_up_front(dec):
    prompt = dec.tokenize("Once upon a time there was a")
    events = dec.stream(prompt, max_tokens=4, sampling=GREEDY, draft_max=2)
    next(events)  # PromptEvaluated
    assert dec.draft.cached == prompt[:-1]
    events.close()


class PauseThenDraft:
    """Plain target steps for `paused` rounds, then drafts of 2; keeps every outcome."""

    def __init__(self, paused: int) -> None:
        self.paused, self.rounds, self.outcomes = paused, 0, []

    def choose(self, source="model", match=0):
        self.rounds += 1
        return 0 if self.rounds <= self.paused else 2

    def extend(self, j, confidence):
        return "more"

    def observe(self, outcome):
        self.outcomes.append(outcome)

    def describe(self):
        return "pause, then draft"

    def explain(self):
        return ""

    def predicted_speedup(self):
        return None

    def may_draft(self, source="model", behind=0):
        return True


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0, seed=3)])
def test_a_draft_catching_up_reports_how_it_would_have_done_while_paused(dec, sampling):
    """The round that drafts after 12 plain steps carries, in ModelWork.shadow, the
    draft's first-draft acceptance at each of them: greedy, whether its argmax was the
    target's token; sampled, min(1, q(x)/p(x)), with p and q read here by teacher forcing."""
    prompt = dec.tokenize("Once upon a time")
    policy = PauseThenDraft(12)
    res = dec.generate(prompt, max_tokens=30, sampling=sampling, draft_max=policy)
    if sampling.greedy:
        assert res.tokens == dec.generate(prompt, max_tokens=30, sampling=GREEDY,
                                          draft_max=0).tokens
    shadows = [o.work.shadow for o in policy.outcomes]
    assert all(not s for s in shadows[:12]) and all(not s for s in shadows[13:])
    shadow = shadows[12]
    assert len(shadow) == 12

    history = prompt + res.tokens[:12]
    n = len(prompt)
    draft, target = dec.draft, dec.target
    draft.clear()
    draft.decode(history[: n - 1], "none")
    draft.decode(history[n - 1 :], "all")  # the same batch the catch-up decoded
    q_rows = [draft.logits_row(i).copy() for i in range(12)]
    expected = []
    for i in range(12):
        x = history[n + i]
        target.clear()
        target.decode(history[: n + i], "last")
        p = probabilities(target.logits_row(-1), sampling)
        if sampling.greedy:
            expected.append(float(int(np.argmax(q_rows[i])) == x))
        else:
            q = probabilities(q_rows[i], sampling)
            expected.append(min(1.0, float(q[x]) / float(p[x])))
    # the plain steps decoded the target a token at a time: q/p moves by 4x the logits'
    # noise at most (both logs by 2x), a row one position off moves it by far more
    bound = tolerance(split_noise(target, history, n))
    dec.reset()
    assert shadow == pytest.approx(expected, rel=bound)
    assert 0 < sum(shadow) < 12  # the tiny draft agrees often, not always

    if sampling.greedy:
        return  # a greedy draft is never cut by p_min
    # Where the draft's top token is below p_min it would not have drafted: those
    # positions are no evidence either way (a cut draft is not a rejection).
    # p_min binds only a policy without a stop rule of its own (auto learns where to stop).
    tops = [float(probabilities(q, sampling).max()) for q in q_rows]
    p_min = float(np.median(tops))
    dec.p_min = p_min
    try:
        policy, ruled = PauseThenDraftNoRule(12), PauseThenDraft(12)
        again = dec.generate(prompt, max_tokens=30, sampling=sampling, draft_max=policy)
        ruled_again = dec.generate(prompt, max_tokens=30, sampling=sampling, draft_max=ruled)
    finally:
        dec.p_min = 0.0
    assert again.tokens[:12] == res.tokens[:12]  # the target alone drew them
    kept = [e for e, top in zip(expected, tops) if top >= p_min]
    assert 0 < len(kept) < 12
    assert policy.outcomes[12].work.shadow == pytest.approx(kept, rel=bound)
    assert ruled_again.tokens[:12] == res.tokens[:12]
    assert ruled.outcomes[12].work.shadow == pytest.approx(expected, rel=bound)


class PauseThenDraftNoRule(PauseThenDraft):
    """The same, without a stop rule: drafts run to 2 unless p_min cuts them."""

    extend = staticmethod(always_more)


def test_p_min_cuts_the_drafts_of_a_fixed_length_not_of_a_stop_rule(dec):
    """At T > 0, `p_min` ends a fixed-length draft where the draft's top token is below
    it; a policy with its own stop rule (auto) is not overruled: its rule learns what a
    confidence is worth (a near-copy MTP layer's drafts were cut half the time by 0.2
    and accepted 99%)."""
    prompt = dec.tokenize("Once upon a time")
    sampling = SamplingParams(temperature=1.0, seed=5)
    dec.p_min = 1.0  # no top token reaches it
    try:
        fixed = dec.generate(prompt, max_tokens=20, sampling=sampling, draft_max=2)
        ruled = PauseThenDraft(0)
        dec.generate(prompt, max_tokens=20, sampling=sampling, draft_max=ruled)
    finally:
        dec.p_min = 0.0
    assert fixed.stats.drafted == 0
    assert all(o.k == 2 for o in ruled.outcomes[:-1]) and ruled.outcomes[0].k == 2


def test_a_greedy_draft_reads_its_confidence_only_for_a_stop_rule(dec, monkeypatch):
    """Greedy, the draft's confidence is a softmax over the whole vocabulary: a fixed draft
    length never asks for it, a policy with a stop rule (auto) gets it at every row."""
    import specllama.engine.drafting.model as drafts

    real, calls = drafts.confidence, []

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(drafts, "confidence", counted)
    fixed = dec.generate("The quick brown fox", max_tokens=12, sampling=GREEDY, draft_max=3)
    assert fixed.stats.drafted > 0 and calls == []

    ruled = dec.generate("The quick brown fox", max_tokens=12, sampling=GREEDY,
                         draft_max=PauseThenDraft(paused=0))  # its own extend: a rule
    assert ruled.tokens == fixed.tokens
    assert len(calls) == ruled.stats.drafted > 0
