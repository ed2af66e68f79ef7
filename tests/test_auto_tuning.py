"""The auto policy's tuned numbers, one mechanism at a time: what each does, shown by
switching it or moving its number; AutoTuning from the environment; the stats' line.

`pytest.approx` at its default (relative 1e-6) compares float64 arithmetic done two ways
(a formula against the code's), whose rounding is ~1e-15: far inside it."""

import json
from types import SimpleNamespace

import pytest

from harness.simulated import outcome
from specllama.errors import InvalidParameterError
from specllama.policy import AutoDraftLength, AutoState, AutoTuning
from specllama.policy.acceptance import AcceptanceEstimate
from specllama.policy.calibration import CostCurve
from specllama.policy.costs import decide, expected_tokens

FLAT_RATIOS = [1.0 + 0.04 * n for n in range(16)]
# SmolLM2 Q4_1 on a 2-core machine, T(n)/T(1): drafting never pays there.
SMOL_RATIOS = [1.0, 1.8, 2.2, 2.6, 3.3, 3.5, 3.8, 4.5, 5.0, 5.5, 6.0, 6.6, 7.2, 7.8, 8.3, 8.8]
DEFAULT = AutoTuning()


def state_for(tuning=None, t1=0.04, draft_ratio=0.3, ratios=FLAT_RATIOS) -> AutoState:
    step = t1 * draft_ratio  # a catch-up is priced at nothing until measured
    return AutoState(CostCurve(tuple(t1 * r for r in ratios)), CostCurve((step, step)),
                     tuning=tuning)


def break_even(st: AutoState) -> float:
    """The lowest acceptance at which drafting is worth starting for."""
    costs = st.costs("model")
    return next(a / 1000 for a in range(1000)
                if decide(a / 1000, costs, st.k_max, DEFAULT.margin).speculate)


def seen_at(st: AutoState, alpha: float, rounds: int = 200) -> None:
    """The draft model showed first-draft acceptance alpha on many paused tokens."""
    acceptance = st.sources["model"].acceptance
    acceptance.prior = alpha
    acceptance.observe_first([alpha] * rounds)
    st.sources["model"].decision = None


def pin(st: AutoState, alpha: float) -> None:
    """Pin the model draft's acceptance estimate at alpha, at every position."""
    st.sources["model"].acceptance = AcceptanceEstimate(prior=alpha, prior_weight=1e12,
                                                        position_weight=1e12)
    st.sources["model"].decision = None


def probes_in(policy: AutoDraftLength, rounds: int) -> int:
    probes = 0
    for _ in range(rounds):
        k = policy.choose("model")
        probes += k > 0
        policy.observe(outcome(k, 0, "model", 0.0, 0.0))
    return probes


# ----------------------------------------------------------------------------- upper_z


@pytest.mark.parametrize(("upper_z", "probes"), [(DEFAULT.upper_z, False), (3.0, True)])
def test_the_upper_bound_stops_probes_the_evidence_rules_out(upper_z, probes):
    """Probes are drafted only where drafting could pay at the estimate's upper bound:
    acceptance seen on hundreds of paused tokens, a little under what drafting needs,
    stops them; a wider bound (3 deviations) keeps them coming, each a catch-up."""
    st = state_for(AutoTuning(upper_z=upper_z))
    seen_at(st, break_even(st) - 0.05)
    policy = AutoDraftLength(st)
    assert policy.may_draft("model") == probes
    assert (probes_in(policy, 300) > 0) == probes


@pytest.mark.parametrize(("upper_min_evidence", "probes"),
                         [(DEFAULT.upper_min_evidence, True), (0.0, False)])
def test_one_rejected_probe_does_not_bound_the_next(upper_min_evidence, probes):
    """A near-copy MTP layer's first-round probe rejected once left an estimate of 0.48
    and a bound of 0.73, under which no probe paid for the rest of the call (greedy, 2 of
    5 calls drafted nothing: 0.97x the target alone instead of 1.02x or better). One
    draft says little of a rate: probes go on until there are two."""
    st = state_for(AutoTuning(upper_min_evidence=upper_min_evidence))
    estimate = st.sources["model"].acceptance
    estimate.observe(1, 0)
    assert (estimate.upper() == 1.0) == probes
    if not probes:
        assert estimate.upper() < 0.75  # what held the MTP layer back
    estimate.observe(1, 0)  # a second rejection: bounded
    assert estimate.upper() < 1.0


# ----------------------------------------------------------------------------- carry_over


def after_a_new_call(carry_over: float) -> float:
    """The acceptance estimate after a call of rejected drafts, then a new call (a new
    text) whose first 10 drafts of 3 are all accepted."""
    st = state_for(AutoTuning(carry_over=carry_over))
    for _ in range(100):
        st.sources["model"].acceptance.observe(1, 0)

    class Decoder:
        policy_state = {"auto": st}
        target = SimpleNamespace(others=0, companions=0)

    policy = AutoDraftLength.for_decoder(Decoder())
    for _ in range(10):
        st.sources["model"].acceptance.observe(3, 3)
    return policy.state.sources["model"].acceptance.overall


def test_a_new_call_keeps_only_part_of_what_the_last_one_taught():
    kept_all, default, kept_none = (after_a_new_call(c) for c in (1.0, DEFAULT.carry_over,
                                                                   0.0))
    assert kept_all < default < kept_none  # the new text weighs more, the less is kept
    assert default - kept_all > 0.05
    assert kept_none > 0.8  # nothing kept: ten good rounds and the prior


def test_for_decoder_carries_over_the_confidence_evidence_too():
    st = state_for()
    for _ in range(50):
        st.confidence.observe((0.95, 0.35), 1)
    before = st.confidence.evidence

    class Decoder:
        policy_state = {"auto": st}
        target = SimpleNamespace(others=0, companions=0)

    AutoDraftLength.for_decoder(Decoder())
    assert st.confidence.evidence == pytest.approx(before * DEFAULT.carry_over)


# ----------------------------------------------------------------------------- confidence


def predicted_after_one_round(confidence_rounds: int) -> tuple[float, float, float]:
    """The prediction for one round of two drafts at confidence 0.95, with acceptance per
    position pinned at 0.5, after the draft model's confidence 0.95 was verified right
    `confidence_rounds` times. Returns (predicted, by position, by confidence)."""
    st = state_for(t1=0.04, draft_ratio=0.1)
    for _ in range(confidence_rounds):
        st.confidence.observe((0.95,), 1)
    pin(st, 0.5)
    policy = AutoDraftLength(st)
    policy.choose("model")
    costs, sure = st.costs("model"), st.confidence.rate(0.95)
    policy.observe(outcome(2, 2, "model", 0.05, 0.008, confidences=(0.95, 0.95)))
    alone = costs.round_s(0) / costs.round_s(2)
    return (policy.predicted_speedup(), expected_tokens(0.5, 2) * alone,
            expected_tokens(sure, 2) * alone)


def test_the_prediction_trusts_the_draft_models_confidence_after_enough_evidence():
    """Below confidence_evidence verified drafts the prediction uses acceptance per
    position; from there on what each drafted token's confidence says."""
    few = 20  # decayed, 20 verified drafts count about 16.6: under 30
    predicted, by_position, _ = predicted_after_one_round(few)
    assert predicted == pytest.approx(by_position)
    predicted, by_position, by_confidence = predicted_after_one_round(80)
    assert predicted == pytest.approx(by_confidence) and by_confidence > 1.3 * by_position


# ------------------------------------------------------------ an unmeasured catch-up


LINEAR_3MS = CostCurve((0.012, 0.015))  # a draft step of 12 ms, each missed token 3 ms


def resumes_after(behind: int, tuning: AutoTuning = DEFAULT,
                  draft: CostCurve = LINEAR_3MS) -> bool:
    """Paused while the target decoded `behind` tokens alone, does auto resume at a
    gain of 6%, with no catch-up measured yet?"""
    st = AutoState(CostCurve(tuple(0.04 * r for r in FLAT_RATIOS)), draft, tuning=tuning)
    seen_at(st, 0.0)
    policy = AutoDraftLength(st)
    assert policy.choose("model") == 0
    policy.observe(outcome(0, 0, "model", 0.0, 0.0, draft_behind=behind))
    lo, hi = 0.0, 1.0
    for _ in range(40):  # the acceptance at which the best k gives 1.06x
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if decide(mid, st.costs("model"), st.k_max, 0.0).speedup < 1.06 \
            else (lo, mid)
    pin(st, hi)
    return policy.choose("model") > 0


def test_an_unmeasured_catch_up_is_priced_at_the_draft_models_calibration():
    """Until the loop has measured a catch-up, one on n missed tokens costs what the
    draft model's calibration says a batch of n + 1 costs beyond one token: 40 of them
    (3 ms each here, 120 ms over 16 rounds) outweigh a 6% gain; priced at nothing, or
    not priced, auto would resume. Where a batch's tokens cost less each the more there
    are (here 0.5 ms from the 2nd to the 8th, 0.25 ms after), 40 of them (14 ms) no
    longer outweigh it."""
    assert resumes_after(1)
    assert not resumes_after(40)
    assert resumes_after(40, draft=CostCurve((0.012, 0.012)))
    assert resumes_after(40, AutoTuning(resume_horizon=float("inf")))  # not priced at all
    cheaper = CostCurve.from_points({1: 0.012, 2: 0.015, 8: 0.018, 64: 0.032}, 64)
    assert cheaper.t(41) - cheaper.t(1) == pytest.approx(0.01425)
    assert resumes_after(40, draft=cheaper)


# ----------------------------------------------------------------------------- switches


def test_tuning_from_the_environment(monkeypatch):
    monkeypatch.setenv("SPECLLAMA_AUTO_TUNING", "probe_k=0, upper_z=inf,shadow=off")
    tuning = AutoTuning.from_env()
    assert (tuning.probe_k, tuning.upper_z, tuning.shadow) == (0, float("inf"), False)
    assert tuning.changed() == "probe_k=0,upper_z=inf,shadow=False"
    assert AutoTuning.parse("") == AutoTuning()


@pytest.mark.parametrize(("text", "says"), [
    ("bogus=1", "'bogus=1' is not name=value with a name of AutoTuning"),
    ("probe_k", "'probe_k' is not name=value"),
    ("probe_k=two", "probe_k='two' is not a valid int"),
    ("upper_z=nan", "upper_z='nan' is not a valid float"),
    ("shadow=maybe", "shadow='maybe' is not a valid bool"),
])
def test_bad_tuning_is_one_line(text, says):
    with pytest.raises(InvalidParameterError, match=says):
        AutoTuning.parse(text)


def test_a_bad_tuning_on_the_command_line_is_one_line_and_exit_2(run, tiny):
    result = run("generate", "Hello", *tiny, "--raw", "--max-tokens", 2,
                 env={"SPECLLAMA_AUTO_TUNING": "probes=off"})
    assert result.exit_code == 2
    assert "SPECLLAMA_AUTO_TUNING: 'probes=off'" in result.stderr
    assert "Traceback" not in result.output


def test_json_stats_carry_the_reasoning_behind_the_one_line(run, tiny):
    result = run("generate", "Hello world", *tiny, "--raw", "--json", "--max-tokens", 8,
                 "--temperature", 0, "--draft-max", "auto")
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)["stats"]
    assert stats["policy_note"].startswith("auto: ") and "\n" not in stats["policy_note"]
    assert "model draft: " in stats["policy_detail"]
    assert "the target alone" in stats["policy_detail"]
