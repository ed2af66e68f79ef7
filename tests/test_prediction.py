"""A request's prediction of its output as a draft source (OpenAI's Predicted Outputs):
where it drafts from, that it joins any chain first, and that the output stays the
target's own, greedy (token for token) and sampled (the first-two-token law, as
test_exactness.py checks it, with the prediction the only drafter)."""

from __future__ import annotations

import io
import json

import pytest
from drafts import Lengths, ask
from noise import assert_a_tie
from test_exactness import exact_first_two, goodness_of_fit
from test_speculative import PROMPTS

import specllama.engine.sampling as sampling_module
from specllama import (
    DraftProposed,
    Finished,
    InvalidParameterError,
    RoundVerified,
    SamplingParams,
    SpeculativeDecoder,
)
from specllama.cli.liveview import LiveDrafts
from specllama.engine.drafting.base import Start
from specllama.engine.drafting.chain import NOBODY, Drafters, build_chain
from specllama.engine.drafting.prediction import (
    Place,
    Prediction,
    PredictionDrafter,
    PredictionIndex,
)
from specllama.engine.llama import Model
from specllama.engine.sampling import probabilities

GREEDY = SamplingParams(temperature=0.0)
MAGENTA, BLUE = "\x1b[35m", "\x1b[34m"  # the live view's prediction and other drafts
#: Token ids the tiny models' text never holds (byte-fallback tokens of control bytes,
#: down-weighted: tests/tinymodels.py): a prediction of them is wrong everywhere.
NEVER = list(range(6, 30))


def drafter_after(prediction, prompt, output, piece=None, added_space=False):
    """A PredictionDrafter begun on `prompt` and told the output so far, a token a round."""
    drafter = PredictionDrafter(Prediction(tuple(prediction), added_space), piece)
    drafter.begin(Start(prompt, False, Lengths(4)))
    for n in range(1, len(output) + 1):
        drafter.accept([*prompt, *output[:n]])
    return drafter


# ------------------------------------------------------------------ where it drafts from


def test_it_drafts_the_prediction_from_its_start_with_q_none():
    prompt, pred = [1, 2, 3], [50, 51, 52, 53, 54, 55]
    drafter = drafter_after(pred, prompt, [])
    draft = drafter.draft(ask(prompt, 4))
    assert draft.tokens == [50, 51, 52, 53] and draft.qs == [None] * 4
    assert draft.origins == ["prediction"] * 4 and draft.source == "lookup"
    # in step after two tokens: the next ones, as many as the policy allows
    drafter = drafter_after(pred, prompt, [50, 51])
    assert drafter.draft(ask([*prompt, 50, 51], 2)).tokens == [52, 53]
    assert drafter.draft(ask([*prompt, 50, 51], 9)).tokens == [52, 53, 54, 55]


def test_after_an_edit_it_rejoins_the_prediction_where_the_output_does():
    prompt = [1]
    pred = list(range(100, 140))
    # tokens 110-112 replaced by an edit of two tokens: out of step until three tokens of
    # the prediction follow it, then in step after them
    output = [*pred[:10], 7, 8, 113, 114]
    drafter = drafter_after(pred, prompt, output)
    assert drafter.place.pos is None
    assert drafter.draft(ask([*prompt, *output], 4)).tokens == []
    output.append(115)
    drafter = drafter_after(pred, prompt, output)
    assert drafter.place == Place(16, 3, 10)  # pred[16] is 116
    assert drafter.draft(ask([*prompt, *output], 3)).tokens == [116, 117, 118]


def test_a_repeated_passage_rejoins_after_the_place_the_output_left():
    """Code repeats its lines: the copy just after where the output left the prediction
    is the one it rejoins, not an earlier or a later one."""
    line = [60, 61, 62, 63]
    pred = [*line, 70, *line, 71, *line, 72, *line, 73]
    index = PredictionIndex(Prediction(tuple(pred)))
    # the output left the prediction at position 6 (inside the second copy)
    found = index.find([9, 9, *line], left=6)
    assert found.pos == 14 and pred[found.pos] == 72  # the third copy: the first after 6
    # left at the end: none after it, the nearest before
    assert index.find([9, *line], left=len(pred)).pos == 19


def test_after_a_deletion_it_rejoins_far_ahead():
    pred = list(range(100, 300))
    drafter = drafter_after(pred, [1], [*pred[:10], *pred[150:160]])  # 140 tokens cut
    assert drafter.place == Place(160, 10, 10)
    assert drafter.draft(ask([1, *pred[:10], *pred[150:160]], 2)).tokens == [260, 261]


def test_a_full_window_rejoins_the_copy_whose_match_runs_further_back():
    block = list(range(60, 68))  # as long as the n-gram window
    pred = [50, *block, 70, 51, *block, 71]
    index = PredictionIndex(Prediction(tuple(pred)))
    # both copies are at or after where the output left; the second is preceded by 51,
    # as the output's copy is
    assert index.find([51, *block], left=0) == Place(19, 9, 0)
    assert index.find([50, *block], left=0) == Place(9, 9, 0)


def test_the_longest_match_wins_and_short_ones_do_not_align():
    pred = [10, 11, 12, 13, 5, 11, 12, 13, 14]
    index = PredictionIndex(Prediction(tuple(pred)))
    assert index.find([10, 11, 12, 13], left=0) == Place(4, 4, 0)
    assert index.find([12, 13], left=0).pos is None  # two tokens: common words, not copying


PIECES = {10: b" H", 11: b"ello", 12: b" world", 20: b"H", 21: b"el", 22: b"lo",
          23: b" Hello"}


def test_where_the_output_spells_the_prediction_in_other_tokens_its_text_decides():
    """" Hello world" tokenized on its own, with the space a SentencePiece tokenizer
    adds: the output's first token is the target's own, then wherever the output's text
    reaches a boundary of the prediction's tokens, it is in step there."""
    prompt, pred = [1], [10, 11, 12]
    drafter = drafter_after(pred, prompt, [], PIECES.get, added_space=True)
    assert drafter.draft(ask(prompt, 4)).tokens == []  # begins with or without the space
    for output, then in (([20], [11, 12]), ([10], [11, 12]), ([23], [12]),
                         ([20, 21, 22], [12])):
        drafter = drafter_after(pred, prompt, output, PIECES.get, added_space=True)
        assert drafter.draft(ask([*prompt, *output], 4)).tokens == then, output
    # other text: out of step
    drafter = drafter_after(pred, prompt, [20, 22], PIECES.get, added_space=True)
    assert drafter.place.pos is None and drafter.place.text is None


def test_it_joins_any_chain_first_and_draft_max_0_leaves_it_out(tiny_target):
    chain = build_chain(NOBODY, model=None, p_min=0.0, ends=lambda t: False, shadow=False,
                        archives=(), prediction=Prediction((50, 51)))
    assert [d.name for d in chain.drafters] == ["prediction"]
    chain = build_chain(Drafters.parse("lookup"), model=None, p_min=0.0,
                        ends=lambda t: False, shadow=False, archives=(),
                        prediction=Prediction((50,)))
    assert [d.name for d in chain.drafters] == ["prediction", "lookup"]
    dec = SpeculativeDecoder.load(tiny_target, n_ctx=256, n_threads=1)
    try:
        prompt = dec.tokenize("the cat sat on the")
        alone = dec.generate(prompt, max_tokens=12, sampling=GREEDY, draft_max=0,
                             prediction=[5, 6, 7])
        assert alone.stats.drafted == 0
        with pytest.raises(InvalidParameterError, match="prediction holds a token id"):
            dec.generate(prompt, max_tokens=4, prediction=[dec.target.n_vocab])
    finally:
        dec.close()


# ------------------------------------------------------------------ exact, greedy


@pytest.fixture(scope="module")
def dec(tiny_target, tiny_draft):
    d = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=512, n_threads=1, p_min=0.0)
    yield d
    d.close()


@pytest.fixture(scope="module")
def probe(tiny_target):
    m = Model(tiny_target, n_ctx=512, n_threads=1)
    yield m
    m.close()


def rounds_of(dec, prompt, **kwargs):
    """The result and, per round, (output tokens before it, its RoundVerified)."""
    seen, at, result = [], 0, None
    for ev in dec.stream(prompt, max_tokens=40, sampling=GREEDY, draft_cache=False, **kwargs):
        if isinstance(ev, RoundVerified):
            seen.append((at, ev))
            at += ev.emitted
        elif isinstance(ev, Finished):
            result = ev.result
    return result, seen


def edited(tokens):
    """The greedy output with tokens 12-15 replaced: an edit in the middle."""
    return [*tokens[:12], *NEVER[:4], *tokens[16:]]


@pytest.mark.parametrize("case", ["right", "half right", "wrong everywhere"])
@pytest.mark.parametrize("drafters", ["none", "lookup,model"])
def test_greedy_output_equals_the_target_alone(dec, probe, case, drafters):
    rejoined = 0
    for text in PROMPTS:
        prompt = dec.tokenize(text)
        alone = dec.generate(prompt, max_tokens=40, sampling=GREEDY, draft_max=0)
        prediction = {"right": alone.tokens, "half right": edited(alone.tokens),
                      "wrong everywhere": NEVER}[case]
        result, seen = rounds_of(dec, prompt, draft_max=4, drafters=drafters,
                                 prediction=prediction)
        s = result.stats
        if result.tokens != alone.tokens:
            j = next(i for i, (a, b) in enumerate(zip(result.tokens, alone.tokens)) if a != b)
            assert_a_tie(probe, prompt, alone.tokens[:j], f"{case} {text!r}")
            continue
        if case == "right" and len(alone.tokens) > 1:
            assert s.origin_accepted["prediction"] == s.origin_drafted["prediction"] > 0
        if case == "wrong everywhere":
            assert s.origin_accepted.get("prediction", 0) == 0
        # a round drafting from the prediction after the edit, accepted
        rejoined += any(at > 16 and ev.m > 0 and "prediction" in ev.origins
                        for at, ev in seen)
    if case == "half right":
        assert rejoined >= len(PROMPTS) // 2, rejoined


def test_a_text_prediction_drafts_in_target_tokens(dec):
    prompt = dec.tokenize("Once upon a time")
    alone = dec.generate(prompt, max_tokens=40, sampling=GREEDY, draft_max=0)
    result = dec.generate(prompt, max_tokens=40, sampling=GREEDY, draft_max=4,
                          drafters="none", prediction=alone.text, draft_cache=False)
    assert result.tokens == alone.tokens
    assert result.stats.origin_accepted["prediction"] > len(alone.tokens) // 2


def test_drafts_are_announced_with_their_origin(dec):
    prompt = dec.tokenize("Hello world")
    alone = dec.generate(prompt, max_tokens=12, sampling=GREEDY, draft_max=0)
    proposed = [ev for ev in dec.stream(prompt, max_tokens=12, sampling=GREEDY, draft_max=3,
                                        drafters="none", prediction=alone.tokens)
                if isinstance(ev, DraftProposed)]
    assert proposed and all(set(ev.origins) == {"prediction"} for ev in proposed)


# ------------------------------------------------------------------ exact, sampled

#: Seeded runs of each law test. The residual that keeps the rejected token (the subtler
#: of the two wrong rules tried) moved the law to p-values of 1e-19 (top-k 8) and 2e-10
#: (top-p 0.9) with 375 runs, and accepting every predicted token to 1e-27 with 50
#: (tiny models, AMD EPYC): 1,000 rejects either many times over.
RUNS = 1000
LAW_BASES = ["the cat sat on the", "The quick brown fox", "Once upon a time", "Hello world",
             "I see the dog", "a b c d"]


def law_prompt(dec, probe, params):
    """A prompt and its greedy continuation as the prediction, the prompt whose first
    predicted token the target draws with probability nearest 1/2 (accepted and
    rejected both, often)."""
    best = None
    for text in LAW_BASES:
        prompt = dec.tokenize(text)
        cont = dec.generate(prompt, max_tokens=3, sampling=GREEDY, draft_max=0).tokens
        if len(cont) < 3 or any(probe.is_eog(t) for t in cont):
            continue
        probe.clear()
        probe.decode(prompt, "last")
        p = float(probabilities(probe.logits_row(-1), params)[cont[0]])
        probe.clear()
        if best is None or abs(p - 0.5) < abs(best[2] - 0.5):
            best = (prompt, cont, p)
    assert best is not None and 0.05 < best[2] < 0.95, best
    return best[0], best[1]


def first_two(dec, prompt, params, prediction, runs):
    """Counts of the first two tokens over `runs` seeds (3 generated, so that the first
    round drafts 2 and both positions meet the rule), and the prediction's drafted and
    accepted tokens."""
    counts: dict = {}
    drafted = accepted = 0
    for seed in range(runs):
        s = SamplingParams(params.temperature, params.top_k, params.top_p, params.min_p, seed)
        r = dec.generate(prompt, max_tokens=3, sampling=s, draft_max=4, drafters="none",
                         prediction=prediction, keep_cache=True, draft_cache=False)
        key = (r.tokens[0], r.tokens[1] if len(r.tokens) > 1 else None)
        counts[key] = counts.get(key, 0) + 1
        drafted += r.stats.origin_drafted.get("prediction", 0)
        accepted += r.stats.origin_accepted.get("prediction", 0)
    return counts, drafted, accepted


LAW_CASES = {
    "right, temperature 1 top-k 8": ("right", SamplingParams(temperature=1.0, top_k=8)),
    "right, top-p 0.9": ("right", SamplingParams(temperature=0.8, top_p=0.9)),
    "wrong everywhere, temperature 1 top-k 8": (
        "wrong", SamplingParams(temperature=1.0, top_k=8)),
}


@pytest.mark.parametrize("name", list(LAW_CASES))
def test_first_two_tokens_follow_the_target_distribution(dec, probe, name):
    which, params = LAW_CASES[name]
    prompt, cont = law_prompt(dec, probe, params)
    prediction = cont if which == "right" else NEVER
    exact = exact_first_two(probe, prompt, params)
    counts, drafted, accepted = first_two(dec, prompt, params, prediction, RUNS)
    # the rule was really exercised: two drafts a run at least, some accepted, some not
    assert drafted >= 2 * RUNS
    assert (0.05 * RUNS < accepted < drafted) if which == "right" else accepted == 0
    pvalue = goodness_of_fit(counts, exact)
    assert pvalue > 1e-3, f"{name}: p-value {pvalue:.2e}"


def test_the_law_test_rejects_a_wrong_rule(dec, probe, monkeypatch):
    """A rejected prediction token kept in the residual it is resampled from is not the
    target's law, and the test sees it with a quarter of its runs."""
    _, params = LAW_CASES["right, temperature 1 top-k 8"]
    prompt, cont = law_prompt(dec, probe, params)
    exact = exact_first_two(probe, prompt, params)
    monkeypatch.setattr(sampling_module, "residual", lambda p, q, token: p)
    counts, _, _ = first_two(dec, prompt, params, cont, RUNS // 4)
    for key in counts:
        exact.setdefault(key, 1e-12)
    assert goodness_of_fit(counts, exact) < 1e-6


# ------------------------------------------------------------------ the command line


def test_generate_predict_drafts_from_the_file_and_changes_nothing(run, tiny, tmp_path):
    args = ["generate", "Once upon a time", *tiny, "--raw", "--max-tokens", 30,
            "--temperature", 0, "--draft-max", 3, "--drafters", "none"]
    plain = run(*args, "--json")
    assert plain.exit_code == 0, plain.output
    answer = json.loads(plain.stdout)["text"]
    (tmp_path / "predicted.txt").write_text(answer, encoding="utf-8")
    trace = tmp_path / "run.html"
    result = run(*args, "--json", "--predict", tmp_path / "predicted.txt", "--trace", trace)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["text"] == answer
    assert report["stats"]["origin_accepted"]["prediction"] > 10
    page = trace.read_text(encoding="utf-8")
    assert "origin-prediction" in page and "copied from the prediction" in page
    shown = run(*args, "--predict", tmp_path / "predicted.txt")
    assert shown.exit_code == 0 and "drafts from it accepted" in shown.stderr


@pytest.mark.parametrize("make", [lambda p: p / "missing.txt",
                                  lambda p: p,  # a folder
                                  lambda p: (p / "latin1.txt", (p / "latin1.txt")
                                             .write_bytes(b"caf\xe9"))[0]])
def test_a_bad_predict_file_is_a_one_line_error(run, tiny, tmp_path, make):
    result = run("generate", "Hi", *tiny, "--predict", make(tmp_path))
    assert result.exit_code == 2, result.output
    assert "--predict" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_show_drafts_colours_the_predictions_drafts_apart():
    out = io.StringIO()
    view = LiveDrafts(out, {10: b"ab", 11: b"cd"}.__getitem__, width=40)
    view.show(DraftProposed((10,), "lookup", ("prediction",)))
    view.show(DraftProposed((11,), "model", ("model",)))
    view.close()
    raw = out.getvalue()
    assert f"{MAGENTA}ab" in raw and f"{BLUE}cd" in raw
