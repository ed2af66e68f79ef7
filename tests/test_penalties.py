"""Repetition penalties: llama.cpp's definition, and the target's law kept under speculation.

The penalty at a position depends on the text before it; under speculation row i of a
verify pass follows the committed text *and the drafts d_1..d_{i-1}*, so that is the
window its p (and the draft's q) is penalized with (docs/architecture.md, "Repetition
penalties"). Greedy output must equal the penalized target alone token for token; at a
temperature, the joint law of the first tokens must match the one computed from the
target alone, and the same test must reject rows penalized without the drafts.
"""

import json
from collections import Counter

import numpy as np
import pytest
from drafts import drafting_ahead
from laws import exact_joint
from test_cli import assert_one_line_error
from test_exactness import goodness_of_fit

import specllama.engine.loop.rounds as rounds
from specllama import InvalidParameterError, Penalties, SamplingParams, SpeculativeDecoder
from specllama.engine.llama import Model
from specllama.engine.penalties import LOGIT_CAP, penalized, penalty_window
from specllama.engine.sampling import probabilities
from specllama.engine.settings import SETTINGS, Settings, validate_setting

# ------------------------------------------------------------------ the definition


def reference(logits: np.ndarray, history: list[int], p: Penalties) -> np.ndarray:
    """llama_sampler_penalties_apply, written out: a loop over the window's counts."""
    out = np.array(logits, dtype=np.float32)
    window = [] if p.last_n == 0 else history if p.last_n < 0 else history[-p.last_n:]
    for token, count in Counter(window).items():
        logit = float(out[token])
        logit = logit * p.repeat if logit <= 0 else logit / p.repeat
        logit -= count * p.frequency + float(count > 0) * p.presence
        out[token] = logit
    return out


def random_case(rng: np.random.Generator, last_n: int) -> tuple[np.ndarray, list[int], Penalties]:
    """A row with some exact zeros and some -inf (a constraint's), a history drawn from a
    few ids (so tokens repeat), and penalties of either sign."""
    logits = rng.normal(0, 3, 60).astype(np.float32)
    logits[rng.choice(60, 5, replace=False)] = 0.0
    logits[rng.choice(60, 5, replace=False)] = -np.inf
    history = [int(t) for t in rng.integers(0, 25, int(rng.integers(0, 90)))]
    pen = Penalties(repeat=float(rng.uniform(0.5, 2.5)), last_n=last_n,
                    presence=float(rng.uniform(-2, 2)), frequency=float(rng.uniform(-2, 2)))
    return logits, history, pen


@pytest.mark.parametrize("last_n", [-1, 0, 1, 7, 64])
def test_penalized_is_llama_cpps_formula(last_n):
    rng = np.random.default_rng(last_n + 10)
    for _ in range(200):
        logits, history, pen = random_case(rng, last_n)
        before = logits.copy()
        got = penalized(logits, penalty_window(history, last_n), pen)
        # float32 rounded twice where the reference rounds once (6e-8 of terms to ~190); atol:
        # terms of ~10 that cancel to ~0 (6e-7)
        np.testing.assert_allclose(got, reference(logits, history, pen), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(logits, before)  # the row read is never written


@pytest.mark.parametrize("repeat", [1e-40, 5e-324])
def test_a_penalty_too_small_for_float32_gives_a_distribution(repeat):
    """Positive logits divided by a penalty under ~1e-38 pass float32's largest value: each
    is held at it (a tie among them), never inf, whose inf - inf made every sampled row NaN
    (found by schemathesis: a 500 for `repeat_penalty: 1e-40` at T > 0)."""
    logits = np.array([2.0, -1.0, 0.5, 3.0, -np.inf], np.float32)
    got = penalized(logits, penalty_window([0, 1, 2, 4], -1), Penalties(repeat=repeat))
    assert np.isfinite(got[:4]).all() and got[4] == -np.inf
    assert got[0] == got[2] == np.float32(LOGIT_CAP)  # the positive ones, tied at the top
    p = probabilities(got, SamplingParams(temperature=0.8, seed=0))
    np.testing.assert_array_equal(p, [0.5, 0.0, 0.5, 0.0, 0.0])  # the rest: -inf and finite


def test_the_window_is_the_same_wherever_the_drafts_begin():
    """The committed text and the drafts before a row form one window, however the text
    is split between them."""
    history = list(range(100, 130))
    for last_n in (-1, 0, 1, 5, 30, 64):
        whole = penalty_window(history, last_n)
        assert len(whole) == (len(history) if last_n < 0 else min(last_n, len(history)))
        for j in range(len(history) + 1):
            np.testing.assert_array_equal(
                penalty_window(history[:j], last_n, history[j:]), whole)


def test_ids_past_the_rows_end_are_skipped():
    """A draft model's shorter vocabulary: target ids past its row change nothing."""
    row = np.array([1.0, -1.0, 2.0], dtype=np.float32)
    got = penalized(row, [0, 5, 5, 7], Penalties(repeat=2.0, presence=0.5))
    np.testing.assert_allclose(got, [0.0, -1.0, 2.0])  # exact in float32: rtol 1e-7


def test_penalties_that_change_nothing_are_none():
    """Off, they cost the round loop one `is None` a row: nothing is copied."""
    for off in (Penalties(), Penalties(repeat=1.3, last_n=0),
                Penalties(repeat=1.0, presence=0.0, frequency=0.0, last_n=-1)):
        assert SamplingParams(penalties=off).penalties is None
    assert Settings().sampling.penalties is None
    on = Settings(repeat_penalty=1.3, repeat_last_n=-1).sampling.penalties
    assert on == Penalties(repeat=1.3, last_n=-1)


_FIELDS = {"repeat_penalty": "repeat", "repeat_last_n": "last_n",
           "presence_penalty": "presence", "frequency_penalty": "frequency"}


@pytest.mark.parametrize("name, value", [
    ("repeat_penalty", 1.0), ("repeat_penalty", 0.0), ("repeat_penalty", -1.0),
    ("repeat_penalty", 0.01), ("repeat_penalty", 3.0), ("repeat_last_n", -1),
    ("repeat_last_n", -2), ("repeat_last_n", 0), ("repeat_last_n", 2.5),
    ("presence_penalty", 2.0), ("presence_penalty", -2.0), ("presence_penalty", 2.5),
    ("frequency_penalty", -2.01), ("frequency_penalty", 0.5), ("frequency_penalty", "x"),
])
def test_penalties_and_the_table_accept_the_same_values(name, value):
    def accepted(check) -> bool:
        try:
            check()
            return True
        except InvalidParameterError:
            return False

    assert accepted(lambda: validate_setting(name, value)) == \
        accepted(lambda: Penalties(**{_FIELDS[name]: value}))
    assert SETTINGS[name].default == getattr(Penalties(), _FIELDS[name])


# ------------------------------------------------------------------ greedy

#: Strong enough to change the tiny target's greedy text within a few tokens.
STRONG = Penalties(repeat=1.5, last_n=64, presence=0.5, frequency=0.3)
REPEATING = "a b c d a b c d a b c"


@pytest.fixture(scope="module")
def pair(tiny_target, tiny_draft):
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=256, n_threads=1, p_min=0.0,
                                  drafters="model")
    probe = Model(tiny_target, n_ctx=256, n_threads=1)
    yield dec, probe
    probe.close()
    dec.close()


def greedy_by_hand(probe: Model, prompt: list[int], pen: Penalties, n: int) -> list[int]:
    """The target alone, one token at a time: the argmax of each row penalized for the
    text before it."""
    probe.clear()
    probe.decode(prompt, "last")
    text = list(prompt)
    for _ in range(n):
        token = int(np.argmax(penalized(probe.logits_row(-1), penalty_window(text, pen.last_n),
                                        pen)))
        text.append(token)
        if probe.is_eog(token):
            break
        probe.decode([token], "last")
    probe.clear()
    return text[len(prompt):]


@pytest.mark.parametrize("pen", [STRONG, Penalties(repeat=1.3, last_n=3),
                                 Penalties(frequency=1.0, last_n=-1)],
                         ids=["strong", "window 3", "frequency, whole text"])
def test_the_target_alone_is_the_penalized_target(pair, pen):
    dec, probe = pair
    prompt = dec.tokenize(REPEATING)
    greedy = SamplingParams(temperature=0.0, penalties=pen)
    alone = dec.generate(prompt, max_tokens=24, sampling=greedy, draft_max=0).tokens
    assert alone == greedy_by_hand(probe, prompt, pen, 24)
    plain = dec.generate(prompt, max_tokens=24, sampling=SamplingParams(temperature=0.0),
                         draft_max=0).tokens
    assert alone != plain  # the penalties act


@pytest.mark.parametrize("drafters, k", [("model", 1), ("model", 3), ("lookup", 3),
                                         ("lookup>model", 3)])
def test_greedy_speculation_equals_the_penalized_target_alone(pair, drafters, k):
    dec, _ = pair
    greedy = SamplingParams(temperature=0.0, penalties=STRONG)
    drafted = 0
    for text in (REPEATING, "the cat sat on the", "Hello world", "one of the two"):
        prompt = dec.tokenize(text)
        alone = dec.generate(prompt, max_tokens=32, sampling=greedy, draft_max=0).tokens
        spec = dec.generate(prompt, max_tokens=32, sampling=greedy, draft_max=k,
                            drafters=drafters, draft_cache=False)
        assert spec.tokens == alone, text
        drafted += spec.stats.drafted
    assert drafted > 0


def test_greedy_drafts_drawn_ahead_equal_the_penalized_target_alone(pair, monkeypatch):
    """Drafting ahead on a thread of its own (drafting/ahead.py), each row penalized for
    the draft and what was drawn ahead before it. The target's decode is slowed, as in
    test_exactness.py, so that tokens are drawn ahead however busy the machine is."""
    dec, _ = pair
    drafting_ahead(dec, monkeypatch)
    greedy = SamplingParams(temperature=0.0, penalties=STRONG)
    ahead = 0
    try:
        for text in (REPEATING, "the cat sat on the"):
            prompt = dec.tokenize(text)
            alone = dec.generate(prompt, max_tokens=40, sampling=greedy, draft_max=0).tokens
            for k in (1, 3):
                spec = dec.generate(prompt, max_tokens=40, sampling=greedy, draft_max=k)
                assert spec.tokens == alone, (text, k)
                ahead += spec.stats.ahead_accepted
    finally:
        dec.set_threads(1, 0)
    assert ahead > 0  # tokens drawn ahead were accepted


# ------------------------------------------------------------------ the law

#: Three tokens at T = 1, top-k 3: at most 27 outcomes, each well populated. The window of
#: 4 slides past the prompt's end while they are drawn, so the committed text and the
#: drafts share it in every proportion.
LAW = SamplingParams(temperature=1.0, top_k=3,
                     penalties=Penalties(repeat=2.0, last_n=4, presence=1.0, frequency=0.5))
LAW_TOKENS = 3
LAW_RUNS = 2500
LAW_PROMPT = "a b c d a b c d a b c"


def exact_penalized_joint(model: Model, prompt: list[int], params: SamplingParams,
                          n: int) -> dict:
    """P(x1..xn) for the penalized target alone, from its logits: every row penalized for
    the prompt and the path before it (a path that ends early is a shorter key)."""
    pen = params.penalties
    assert pen is not None
    return exact_joint(model, prompt, n, lambda path, row: probabilities(
        penalized(row, penalty_window([*prompt, *path], pen.last_n), pen), params))


def first_tokens(dec: SpeculativeDecoder, prompt: list[int], runs: int, **kwargs) -> tuple:
    """Counts of the first LAW_TOKENS tokens over `runs` seeds, and the drafts accepted at
    positions 2 and 3 (those whose rows follow earlier drafts)."""
    counts: Counter = Counter()
    later = 0
    for seed in range(runs):
        s = SamplingParams(LAW.temperature, LAW.top_k, seed=seed, penalties=LAW.penalties)
        res = dec.generate(prompt, max_tokens=LAW_TOKENS, sampling=s, keep_cache=True, **kwargs)
        counts[tuple(res.tokens[:LAW_TOKENS])] += 1
        later += sum(res.stats.accepted_at[1:3])
    return counts, later


def test_the_first_tokens_follow_the_penalized_target(pair):
    dec, probe = pair
    prompt = dec.tokenize(LAW_PROMPT)
    exact = exact_penalized_joint(probe, prompt, LAW, LAW_TOKENS)
    counts, later = first_tokens(dec, prompt, LAW_RUNS, draft_max=3, drafters="model")
    assert later > LAW_RUNS // 4, later  # rows after drafts decided many tokens
    pvalue = goodness_of_fit(counts, exact)
    assert pvalue > 1e-3, f"p-value {pvalue:.2e}"


def test_the_law_test_rejects_rows_penalized_without_the_drafts(pair, monkeypatch):
    """The wrong rule: the target's row i penalized for the committed text alone, as if
    d_1..d_{i-1} were not before it."""
    dec, probe = pair
    real = rounds.penalized_after
    monkeypatch.setattr(rounds, "penalized_after",
                        lambda logits, history, pen, more=(): real(logits, history, pen))
    prompt = dec.tokenize(LAW_PROMPT)
    exact = exact_penalized_joint(probe, prompt, LAW, LAW_TOKENS)
    # a thousand runs reject it at p ~1e-35 (600: ~3e-8): half of LAW_RUNS is plenty
    counts, _ = first_tokens(dec, prompt, LAW_RUNS // 2, draft_max=3, drafters="model")
    for key in counts:
        exact.setdefault(key, 1e-12)
    assert goodness_of_fit(counts, exact) < 1e-6


# ------------------------------------------------------------------ the command line


def test_generate_takes_the_penalty_flags(run, tiny):
    def tokens(*flags):
        result = run("generate", REPEATING, *tiny, "--raw", "--json", "--max-tokens", 16,
                     "--temperature", 0, "--draft-max", 3, *flags)
        assert result.exit_code == 0, result.output
        return result

    penalized_run = tokens("--repeat-penalty", 1.3, "--repeat-last-n", -1,
                           "--presence-penalty", 0.5, "--frequency-penalty", 0.25)
    data = json.loads(penalized_run.stdout)
    assert (data["settings"]["repeat_penalty"], data["settings"]["repeat_last_n"]) == (1.3, -1)
    plain = json.loads(tokens().stdout)
    assert data["tokens"] != plain["tokens"]


@pytest.mark.parametrize("flag, value", [
    ("--repeat-penalty", "0"), ("--repeat-penalty", "-1"), ("--repeat-last-n", "-2"),
    ("--presence-penalty", "2.5"), ("--frequency-penalty", "-3"),
])
def test_out_of_range_penalties_are_one_line_errors(run, tiny, flag, value):
    assert_one_line_error(run("generate", "hi", *tiny, flag, value), flag)
