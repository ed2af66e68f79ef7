"""Constrained output stays exact: the target's distribution masked to what a regex allows.

The exact law of the first tokens is computed from the target's logits with the
constraint's own masks along every path; thousands of seeded speculative runs (model,
lookup and hybrid drafts, chains of 3, tokens the regex forces) must match it, and the
same test must reject a wrong rule (the draft's q handed to the rule unmasked).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from specllama import SamplingParams, SpeculativeDecoder
from specllama.engine.constraint import Constraint, ConstraintSpec, masked
from specllama.engine.drafting import model as drafts_module
from specllama.engine.llama import Model
from specllama.engine.sampling import probabilities
from specllama.errors import ConstraintError
from tests.test_exactness import chi2_pvalue

RUNS = 3000
TOKENS = 3
# Digits only, at least four: every token of the first three is a digit (each digit is
# a token and a byte-fallback token here, so masks allow a dozen ids), and nothing ends
# the output early. top-k 3 after the mask keeps the joint law to at most 27 outcomes.
DIGITS = ConstraintSpec("regex", "[0-4]{4,8}")
# "12" first: two bytes the regex forces, drafted for free and verified like any draft.
FORCED = ConstraintSpec("regex", "12[0-4]{4,8}")
PARAMS = SamplingParams(temperature=1.0, top_k=3)
# Digits in the prompt, so lookup finds matches to draft from.
PROMPT = "the cat sat 3141 and 3141 and 314"


def exact_constrained(model: Model, prompt: list[int], spec: ConstraintSpec,
                      params: SamplingParams, n: int) -> dict:
    """P(x1..xn) for the target alone under the constraint: at each step the logits
    masked at the state after the path so far, then the usual processing."""
    tokenizer = model.grammar_tokenizer()
    joint: dict = {}

    def walk(path: tuple, prob: float) -> None:
        state = Constraint(spec, tokenizer, model.n_vocab)
        state.advance(list(path))
        model.truncate(len(prompt) - 1)
        model.decode([prompt[-1], *path], "last")
        p = probabilities(masked(model.logits_row(-1), state.allowed()), params)
        for x in np.flatnonzero(p > 1e-9):  # (the cutoff of laws.exact_joint, and why)
            key, mass = (*path, int(x)), prob * float(p[x])
            if model.is_eog(int(x)) or len(key) == n:
                joint[key] = joint.get(key, 0.0) + mass
            else:
                walk(key, mass)

    model.clear()
    model.decode(prompt[:-1], "none")
    walk((), 1.0)
    model.clear()
    return joint


def empirical(dec: SpeculativeDecoder, prompt: list[int], spec: ConstraintSpec,
              params: SamplingParams, runs: int = RUNS, **kwargs) -> tuple[dict, int, int]:
    """Counts of the first TOKENS tokens over `runs` seeds; drafted and forced totals."""
    counts: dict = {}
    drafted = forced = 0
    for seed in range(runs):
        s = SamplingParams(params.temperature, params.top_k, params.top_p, params.min_p, seed)
        res = dec.generate(prompt, max_tokens=TOKENS, sampling=s, constraint=spec,
                           keep_cache=True, **kwargs)
        counts[tuple(res.tokens)] = counts.get(tuple(res.tokens), 0) + 1
        drafted += res.stats.drafted
        forced += res.stats.forced
    return counts, drafted, forced


def fit(counts: dict, exact: dict) -> float:
    """Chi-square p-value of the counts against the exact law (rare outcomes pooled)."""
    total = sum(counts.values())
    unseen = set(counts) - set(exact)
    assert not unseen, f"outcomes the constrained target never produces: {sorted(unseen)[:5]}"
    chi2, dof, pooled_obs, pooled_exp = 0.0, -1, 0, 0.0
    for key, prob in exact.items():
        expected = prob * total
        if expected < 5:
            pooled_obs += counts.get(key, 0)
            pooled_exp += expected
            continue
        chi2 += (counts.get(key, 0) - expected) ** 2 / expected
        dof += 1
    if pooled_exp > 0:
        chi2 += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        dof += 1
    return chi2_pvalue(chi2, dof)


@pytest.fixture(scope="module")
def pair(tiny_target, tiny_draft):
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=256, n_threads=1, p_min=0.0)
    probe = Model(tiny_target, n_ctx=256, n_threads=1)
    yield dec, probe, dec.tokenize(PROMPT)
    probe.close()
    dec.close()


CASES = {
    "model drafts": ("model", DIGITS),
    "lookup drafts": ("lookup", DIGITS),
    "hybrid drafts": ("hybrid", DIGITS),
    "forced tokens, then model drafts": ("model", FORCED),
}


@pytest.mark.parametrize("name", list(CASES))
def test_constrained_drafts_follow_the_masked_target_distribution(pair, name):
    dec, probe, prompt = pair
    mode, spec = CASES[name]
    exact = exact_constrained(probe, prompt, spec, PARAMS, TOKENS)
    counts, drafted, forced = empirical(dec, prompt, spec, PARAMS, draft_max=3,
                                        drafters=mode)
    assert drafted + forced > RUNS // 2, "too few drafts to test anything"
    if spec is FORCED:
        assert forced >= RUNS  # "1" and "2" proposed in every run
    pvalue = fit(counts, exact)
    assert pvalue > 1e-3, f"{name}: p-value {pvalue:.2e}"


def test_constrained_target_alone_follows_the_masked_distribution(pair):
    dec, probe, prompt = pair
    exact = exact_constrained(probe, prompt, DIGITS, PARAMS, TOKENS)
    counts, drafted, forced = empirical(dec, prompt, DIGITS, PARAMS, draft_max=0)
    assert drafted == forced == 0
    assert fit(counts, exact) > 1e-3


def test_the_test_rejects_an_unmasked_q(pair, monkeypatch):
    """The draft model draws from its masked q, but the rule is handed its unmasked q
    (smaller at every allowed token): drafts are accepted too often, which the test must
    see."""
    dec, probe, prompt = pair
    real_masked, real_sample = drafts_module.masked, drafts_module.sample
    unmasked: list[np.ndarray] = []

    def keep_unmasked(logits, mask):
        unmasked.append(np.array(logits))
        return real_masked(logits, mask)

    def draw_then_unmask(q, rng):
        token = real_sample(q, rng)
        q[:] = probabilities(unmasked[-1], PARAMS)  # the q the rule will read
        return token

    monkeypatch.setattr(drafts_module, "masked", keep_unmasked)
    monkeypatch.setattr(drafts_module, "sample", draw_then_unmask)
    exact = exact_constrained(probe, prompt, DIGITS, PARAMS, TOKENS)
    counts, drafted, _ = empirical(dec, prompt, DIGITS, PARAMS, draft_max=3,
                                   drafters="model")
    assert drafted > RUNS
    exact.update({k: 1e-12 for k in counts if k not in exact})
    assert fit(counts, exact) < 1e-6


@pytest.mark.parametrize("mode", ["model", "lookup", "hybrid"])
def test_greedy_constrained_speculation_equals_the_constrained_target_alone(pair, mode):
    dec, _, prompt = pair
    greedy = SamplingParams(temperature=0.0)
    for spec in (DIGITS, FORCED, ConstraintSpec("regex", "(cat|dog|the)( (cat|dog|the)){3,6}")):
        alone = dec.generate(prompt, max_tokens=12, sampling=greedy, constraint=spec,
                             draft_max=0)
        spec_run = dec.generate(prompt, max_tokens=12, sampling=greedy, constraint=spec,
                                draft_max=3, drafters=mode)
        assert spec_run.tokens == alone.tokens, spec
        assert alone.stats.forced == 0


def test_forced_tokens_are_drafted_and_counted(pair):
    dec, _, prompt = pair
    res = dec.generate(prompt, max_tokens=8, sampling=SamplingParams(temperature=0.0),
                       constraint=ConstraintSpec("regex", "hello world [0-4]{3}"),
                       draft_max=2, drafters="model")
    assert res.text.startswith("hello world ")
    assert res.stats.forced >= 2 and res.stats.forced_accepted == res.stats.forced
    assert res.stats.to_dict()["forced"] == res.stats.forced


def test_json_schema_output_parses_and_validates(pair):
    dec, _, prompt = pair
    schema = {"type": "object", "properties": {"n": {"type": "integer"},
                                                "ok": {"type": "boolean"}},
              "required": ["n", "ok"], "additionalProperties": False}
    for seed in range(5):
        res = dec.generate(prompt, max_tokens=40, constraint=ConstraintSpec.json_schema(schema),
                           sampling=SamplingParams(temperature=1.0, seed=seed))
        if res.finish_reason == "eos":
            value = json.loads(res.text)
            assert set(value) == {"n", "ok"} and isinstance(value["ok"], bool)
            assert isinstance(value["n"], int)
        else:  # cut by max_tokens: still a prefix of valid JSON
            assert res.text.startswith('{"n": ')


@pytest.mark.parametrize("make, message", [
    (lambda: ConstraintSpec.json_schema("{not json"), "the JSON schema is not valid JSON"),
    (lambda: ConstraintSpec.json_schema("[1, 2]"), "a JSON schema must be a JSON object"),
    (lambda: ConstraintSpec.json_schema("/no/such/schema.json"), "cannot read the JSON schema"),
    (lambda: ConstraintSpec.grammar_file("/no/such/grammar.gbnf"), "cannot read the grammar"),
])
def test_bad_constraints_are_one_line_errors(make, message):
    with pytest.raises(ConstraintError, match=message):
        make()


@pytest.mark.parametrize("spec, message", [
    (ConstraintSpec("regex", "(unclosed"), "the regex is not valid"),
    (ConstraintSpec("grammar", "root ::= missing-rule"), "the grammar is not valid"),
    (ConstraintSpec("json_schema", '{"type": "no-such-type"}'), "the JSON schema is not valid"),
    # found by the HTTP fuzzer: llguidance admitted "" for it, an empty "complete" answer
    (ConstraintSpec.json_schema({"$defs": {"x": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"}),
     "admits no output"),
])
def test_malformed_constraints_fail_before_generating(pair, spec, message):
    dec, _, prompt = pair
    with pytest.raises(ConstraintError, match=message) as caught:
        dec.generate(prompt, max_tokens=4, constraint=spec)
    assert "\n" not in str(caught.value)


def test_generations_of_one_constraint_share_its_compilation_not_its_state(pair):
    """Each generation copies one compiled matcher: a state moved on in one is not in
    the next (a server answers one schema's requests side by side), and a malformed
    constraint is refused every time it is asked for, not only the first."""
    dec, _, _ = pair
    tokenizer, n_vocab = dec.target.grammar_tokenizer(), dec.target.n_vocab
    first, second = Constraint(FORCED, tokenizer, n_vocab), Constraint(FORCED, tokenizer, n_vocab)
    forced = first.forced(2)
    assert forced and second.forced(2) == forced
    first.advance(forced)
    first.settle(forced)
    assert first.forced(2) != forced  # moved past "12"
    assert second.forced(2) == forced and Constraint(FORCED, tokenizer, n_vocab).forced(2) == forced
    for _ in range(2):
        with pytest.raises(ConstraintError, match="admits no output"):
            Constraint(ConstraintSpec.json_schema(
                {"$defs": {"x": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"}), tokenizer, n_vocab)
