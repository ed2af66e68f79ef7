"""A target that drafts for itself with its MTP ("nextn") layers (engine/llama/mtp.py):
no second file, exact under p/q at any temperature.

The tiny Qwen3.5 here has an MTP block built to agree with its target (a copy of its
attention layer fed the token's embedding, with the recurrent layers turned down:
tests/hybridmodels.py), so drafts are accepted often enough to test the rule."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from drafts import GREEDY
from hybridmodels import write_tiny_qwen35
from noise import apart, split_noise, tolerance
from test_cli import assert_one_line_error
from test_hybrid import RUNS, law_fit
from test_parallel import at_once

import specllama.engine.sampling as sampling_module
from specllama import InvalidParameterError, SamplingParams, SpeculativeDecoder
from specllama.cli import cli
from specllama.engine.llama import Model
from specllama.engine.llama.mtp import MtpDraft
from specllama.loading import measure_costs
from specllama.server.jobs import Order
from specllama.server.prompts import Work
from specllama.server.slots import Slots

PROMPTS = ["the cat sat on the", "once upon a time there", "a b c d e f g"]
CHAIN = SamplingParams(temperature=0.8, top_k=3)


@pytest.fixture(scope="module")
def mtp_target(tmp_path_factory):
    return write_tiny_qwen35(tmp_path_factory.mktemp("mtp") / "qwen35-mtp.gguf", mtp=True,
                             mtp_agrees=0.05, recurrent_gain=0.05)


@pytest.fixture(scope="module")
def dec(mtp_target):
    d = SpeculativeDecoder.load(mtp_target, n_ctx=512, n_threads=1, p_min=0.0)
    yield d
    d.close()


def test_a_target_with_mtp_layers_drafts_for_itself_by_default(dec):
    assert isinstance(dec.draft, MtpDraft)
    assert dec.default_drafters == ("lookup", "mtp")


def test_mtp_drafts_in_one_batch_read_as_one_at_a_time(dec):
    """The MTP context's cache: a batch and token-by-token decodes, after a cut, give the
    same rows, within this CPU's float noise (measured on the same rows, no cut: up to
    1.3e-4 on an AMD EPYC, more than the target's 6e-6) and far from a row one position
    off (what a misplaced cell or state reads)."""
    m, t = dec.draft, dec.target
    tokens = dec.tokenize("the cat sat on the mat and the dog ran")
    t.clear()
    m.clear()
    t.decode(tokens, "none")
    noise = max(split_noise(m, tokens[:i + 1]) for i in range(3, len(tokens)))
    m.decode(tokens, "all")
    rows = [m.logits_row(i).copy() for i in range(len(tokens))]
    off_by_one = min(apart(rows[i], rows[i - 1]) for i in range(3, len(tokens)))
    bound = tolerance(noise, bug=off_by_one)
    m.truncate(3)
    for i in range(3, len(tokens)):
        m.decode([tokens[i]], "last")
        np.testing.assert_allclose(m.logits_row(-1), rows[i], atol=bound)
    t.clear()
    m.clear()


@pytest.mark.parametrize("draft_max", [1, 3, 6, "auto"])
def test_greedy_mtp_speculation_equals_the_target_alone(dec, draft_max):
    drafted = accepted = 0
    for prompt in PROMPTS:
        alone = dec.generate(prompt, max_tokens=40, sampling=GREEDY, draft_max=0).tokens
        res = dec.generate(prompt, max_tokens=40, sampling=GREEDY, draft_max=draft_max,
                           drafters=("mtp",))
        assert res.tokens == alone
        drafted, accepted = drafted + res.stats.drafted, accepted + res.stats.accepted
        assert set(res.stats.origin_drafted) <= {"mtp"}
    if draft_max != "auto":
        assert drafted > accepted > 0.3 * drafted  # the built-in agreement shows


def test_mtp_speculation_follows_the_target_law(dec, mtp_target):
    pvalue, drafted_at, accepted_at = law_fit(dec, mtp_target, ("mtp",), CHAIN)
    assert drafted_at[2] > 0 and 0 < accepted_at[0] < drafted_at[0]
    assert pvalue > 1e-3


def test_the_mtp_law_test_rejects_a_wrong_rule(dec, mtp_target, monkeypatch):
    """chi2 ~1,000,000 over 26 cells with all the runs: an eighth of them is plenty."""
    monkeypatch.setattr(sampling_module, "acceptance_probability", lambda p, q, d: 1.0)
    assert law_fit(dec, mtp_target, ("mtp",), CHAIN, runs=RUNS // 8)[0] < 1e-6


def test_mtp_under_parallel_slots(mtp_target, dec):
    """`serve --parallel 2`: each slot's MTP context drafts over its view of the target;
    three greedy requests at once equal each alone."""
    prompts = [dec.tokenize(p) for p in PROMPTS]
    expected = [dec.generate(p, max_tokens=32, sampling=GREEDY, draft_max=3,
                             drafters=("lookup", "mtp")).tokens for p in prompts]
    orders = [Order(i, Work("completion", p, 32, GREEDY, ()), "all", 3, ("lookup", "mtp"))
              for i, p in enumerate(prompts)]
    decoder = SpeculativeDecoder(Model(mtp_target, n_ctx=512, n_threads=1, n_seq=2))
    slots = Slots(decoder, lambda: measure_costs(decoder, "auto", False, lambda _: None))
    try:
        slots.prepare()
        outcomes = at_once(slots, orders)
        assert [o.result.tokens for o in outcomes] == expected
        assert sum(o.result.stats.origin_drafted.get("mtp", 0) for o in outcomes) > 0
        for engine in slots.slots:
            assert isinstance(engine.decoder.draft, MtpDraft)
            view = engine.decoder.target
            assert view.pos_max() + 1 == len(view.cached)
    finally:
        slots.close()
        decoder.close()


def test_asking_for_mtp_without_mtp_layers_names_the_file(tiny_target, run):
    with pytest.raises(InvalidParameterError, match=f"{tiny_target.name} has none"):
        SpeculativeDecoder.load(tiny_target, n_ctx=128, n_threads=1, drafters=("mtp",))
    assert_one_line_error(run("generate", "hi", "--target", tiny_target, "--drafters", "mtp"),
                          "drafters mtp", f"{tiny_target.name} has none")


def test_the_cli_drafts_with_mtp_and_reports_it(mtp_target):
    result = CliRunner().invoke(cli, ["generate", PROMPTS[0], "--raw", "--target",
                                      str(mtp_target), "--max-tokens", "24",
                                      "--draft-max", "3", "--temperature", "0", "--json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["settings"]["draft"] == "mtp"
    assert report["settings"]["drafters"] == ["lookup", "mtp"]
    assert report["stats"]["origin_drafted"].get("mtp", 0) > 0


def test_the_stats_panel_names_the_mtp_drafts(mtp_target):
    result = CliRunner().invoke(cli, ["generate", PROMPTS[0], "--raw", "--target",
                                      str(mtp_target), "--max-tokens", "16",
                                      "--draft-max", "3", "--temperature", "0"])
    assert result.exit_code == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stderr.splitlines() if line.strip()}
    assert "accepted (the target's own MTP layers)" in result.stderr
    assert "lookup" not in rows  # MTP drafts are not lookups


def test_chat_with_an_engine_process_drafts_with_mtp_too(mtp_target):
    """Chat's decoder in an engine process (a remote target's chat) knows the draft is
    the target's MTP layers: `/set drafters mtp` is taken, and the drafts are MTP's."""
    from specllama.cli.chat.remote import RemoteDecoder
    from specllama.engine.drafting.chain import Drafters, draft_kind
    from specllama.loading import RunOptions

    remote = RemoteDecoder(RunOptions(target=str(mtp_target),
                                      flags=(("threads", 1), ("n_ctx", 256))))
    try:
        assert draft_kind(remote.draft) == "mtp"
        assert Drafters.parse("mtp").check(draft_kind(remote.draft)) == ("mtp",)
        with pytest.raises(InvalidParameterError, match="name mtp instead"):
            Drafters.parse("model").check(draft_kind(remote.draft))
        tokens = remote.target.tokenize("the cat sat on the", add_bos=True, special=True)
        stream = remote.stream(tokens, max_tokens=16, sampling=GREEDY, draft_max=3,
                               drafters=("mtp",))
        list(stream)
        stats = stream.result.stats
        assert stats.origin_drafted.get("mtp", 0) > 0 and stats.accepted > 0
    finally:
        remote.close()
