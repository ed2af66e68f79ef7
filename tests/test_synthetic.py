"""Synthetic pairs: a random-weight target of a real shape (here the tiny one, written in
milliseconds) and a draft made of its own first layers, from models.toml to the CLI."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import gguf
import numpy as np
import pytest
from eagle3models import greedy_agreement

from specllama.engine.decoder import SpeculativeDecoder
from specllama.engine.llama import Model
from specllama.engine.sampling import SamplingParams
from specllama.errors import ConfigError, DraftDerivationError
from specllama.models.config import ModelSource, Pair, load_config
from specllama.models.schema import SyntheticSpec
from specllama.models.sources import resolve_pair
from specllama.models.status import locations, source_status
from specllama.models.synthetic import SHAPES, SYNTHETIC_KEY
from specllama.models.synthetic_eagle3 import draft_ids, kept_dims

TINY_SENTENCE = ("random weights in the shape of Tiny (test): costs are real, the text is "
                 "meaningless")
NOTE = f"note: synthetic model, {TINY_SENTENCE}"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """Each test makes its models in a cache of its own."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECLLAMA_CACHE_DIR", str(root))
    return root


def config(tmp_path: Path, target: str, draft: str = '{ derive = "target", layers = 2 }') -> Path:
    path = tmp_path / "models.toml"
    path.write_text(f"[pairs.synth]\ntarget = {target}\ndraft = {draft}\n")
    return path


def tiny_pair(tmp_path: Path, **spec: object) -> Pair:
    """The pair of a tiny synthetic target (F32 unless said) and its first 2 layers."""
    fields = {"quant": "F32", **spec}
    table = ", ".join(f"{k} = {json.dumps(v)}" for k, v in fields.items())
    return load_config(config(tmp_path, f'{{ synthetic = "tiny", {table} }}')).pair("synth")


def tensors(path: Path) -> dict[str, tuple[int, np.ndarray]]:
    reader = gguf.GGUFReader(path)
    return {t.name: (int(t.tensor_type), np.array(t.data)) for t in reader.tensors}


# --------------------------------------------------------------------------- the files


def test_the_tiny_pair_runs_exactly_as_a_pair_of_files_does(tmp_path):
    target, draft = resolve_pair(tiny_pair(tmp_path))
    assert draft is not None
    dec = SpeculativeDecoder.load(target, draft, n_ctx=128, n_threads=1)
    prompt = dec.target.prompt("hello")  # no chat template: the raw text, after BOS
    assert dec.target.chat_template() is None and prompt[0] == dec.target.bos == 1
    greedy = SamplingParams(temperature=0.0)
    drafted = dec.generate(prompt, max_tokens=12, sampling=greedy, draft_max=2,
                           drafters=("model",))
    alone = dec.generate(prompt, max_tokens=12, sampling=greedy, draft_max=0)
    assert drafted.tokens == alone.tokens and drafted.stats.drafted > 0
    assert re.fullmatch(r"( t\d+|\S)+", dec.target.detokenize(alone.tokens))
    dec.close()


def test_the_draft_is_the_targets_first_layers(tmp_path):
    target, draft = resolve_pair(tiny_pair(tmp_path))
    assert draft is not None
    mine, theirs = tensors(draft), tensors(target)
    kept = {n for n in theirs if not n.startswith("blk.") or n.split(".")[1] in ("0", "1")}
    assert set(mine) == kept
    for name, (kind, data) in mine.items():
        assert kind == theirs[name][0] and np.array_equal(data, theirs[name][1]), name
    for path, layers in ((target, SHAPES["tiny"].layers), (draft, 2)):
        model = Model(path, n_ctx=64, n_threads=1)
        assert model.meta("llama.block_count") == str(layers)
        assert model.meta(SYNTHETIC_KEY) == TINY_SENTENCE
        assert model.meta("no.such.key") is None
        model.close()
    assert Model(target, n_ctx=64, n_threads=1).meta("general.name") == "synthetic Tiny (test)"


def test_a_quantized_target_is_made_without_leaving_its_f16_file(tmp_path, cache):
    target, draft = resolve_pair(tiny_pair(tmp_path, quant="Q8_0"))
    assert draft is not None
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name, target.name + ".lock"]
    kinds = {kind for kind, _ in tensors(target).values()}
    assert int(gguf.GGMLQuantizationType.Q8_0) in kinds
    # the draft's quantized blocks are the target's bytes, copied as they are
    assert tensors(draft)["blk.1.attn_q.weight"][0] == int(gguf.GGMLQuantizationType.Q8_0)


def test_made_once_then_reused(tmp_path, cache):
    pair = tiny_pair(tmp_path)
    heard: list[str] = []
    assert source_status(pair) == (
        "ready (the target is written with random weights on first use; "
        "the draft is derived on first use)")
    target, draft = resolve_pair(pair, progress=heard.append)
    assert draft is not None
    assert heard == [
        "making a synthetic Tiny (test) model (random weights, F32, ~7 MB; once, cached in "
        f"{cache / 'synthetic'})",
        f"deriving the draft from the first 2 layers of {target.name} (once; cached in "
        f"{cache / 'derived'})"]
    made = (target.stat().st_mtime_ns, draft.stat().st_mtime_ns)
    heard.clear()
    assert resolve_pair(pair, progress=heard.append) == (target, draft)
    assert heard == [] and (target.stat().st_mtime_ns, draft.stat().st_mtime_ns) == made
    assert source_status(pair) == "ready"
    assert locations(pair) == (str(target), str(draft))


def test_the_same_parameters_make_the_same_file(tmp_path, cache):
    first, _ = resolve_pair(tiny_pair(tmp_path, seed=3))
    data = first.read_bytes()
    first.unlink()
    again, _ = resolve_pair(tiny_pair(tmp_path, seed=3))
    assert again == first and again.read_bytes() == data
    other, _ = resolve_pair(tiny_pair(tmp_path, seed=4))
    assert other != first and other.read_bytes() != data


def _greedy_acceptance(target: Path, draft: Path) -> tuple[float, int]:
    """Acceptance of one-token greedy drafts over a few hundred positions."""
    dec = SpeculativeDecoder.load(target, draft, n_ctx=512, n_threads=1)
    accepted = drafted = 0
    for prompt in ("hello world", "The quick brown fox", "t5 t7 t9", "12345", "zebra"):
        result = dec.generate(dec.target.tokenize(prompt), max_tokens=80,
                              sampling=SamplingParams(temperature=0.0), draft_max=1,
                              drafters=("model",))
        accepted += result.stats.accepted
        drafted += result.stats.drafted
    dec.close()
    return accepted / drafted, drafted


def test_greedy_agreement_rises_as_the_later_layers_shrink(tmp_path):
    rates = {}
    for late in (0.05, 0.3):
        (tmp_path / str(late)).mkdir()
        target, draft = resolve_pair(tiny_pair(tmp_path / str(late), late=late))
        assert draft is not None
        rates[late], drafted = _greedy_acceptance(target, draft)
        assert drafted >= 200
    assert rates[0.05] > 0.9 and rates[0.05] > rates[0.3] + 0.1, rates


def test_a_draft_of_a_real_targets_first_layers(tmp_path, tiny_model_factory):
    real = tiny_model_factory(seed=5, n_layer=3)
    pair = load_config(config(tmp_path, json.dumps(str(real)),
                              '{ derive = "target", layers = 1 }')).pair("synth")
    _, draft = resolve_pair(pair)
    assert draft is not None
    model = Model(draft, n_ctx=64, n_threads=1)
    assert model.meta("llama.block_count") == "1" and model.meta(SYNTHETIC_KEY) is None
    assert model.chat_template() is not None  # every key but the block count is kept
    model.close()
    too_many = load_config(config(tmp_path, json.dumps(str(real)),
                                  '{ derive = "target", layers = 3 }')).pair("synth")
    with pytest.raises(DraftDerivationError, match=(
            rf"^{re.escape(str(real))} has 3 layers: a draft of its first layers takes "
            r"fewer than that, not 3$")):
        resolve_pair(too_many)


def eagle3_pair(tmp_path: Path, **spec: object) -> Pair:
    """A tiny synthetic target made for an EAGLE3 head (F32, every layer at ``late``)
    and that head."""
    fields = {"quant": "F32", "early": 0, "late": 0.05, "eagle3": True, **spec}
    table = ", ".join(f"{k} = {json.dumps(v)}" for k, v in fields.items())
    path = config(tmp_path, f'{{ synthetic = "tiny", {table} }}', '{ eagle3 = "target" }')
    return load_config(path).pair("synth")


def test_an_eagle3_head_is_made_once_for_its_target(tmp_path, cache):
    pair = eagle3_pair(tmp_path)
    assert source_status(pair) == (
        "ready (the target is written with random weights on first use; "
        "the draft is derived on first use)")
    heard: list[str] = []
    target, draft = resolve_pair(pair, progress=heard.append)
    assert draft is not None
    assert target.name == "tiny.F32.early0.late0.05.seed0.v1.eagle3-v1.gguf"
    assert heard == [
        "making a synthetic Tiny (test) model for an EAGLE3 head (random weights, F32, ~7 MB; "
        f"once, cached in {cache / 'synthetic'})",
        f"making the EAGLE3 head for {target.name} (F16; once; cached in {cache / 'derived'})"]
    heard.clear()
    assert resolve_pair(pair, progress=heard.append) == (target, draft) and heard == []
    assert source_status(pair) == "ready"
    assert locations(pair) == (str(target), str(draft))
    reader = gguf.GGUFReader(draft)
    field = reader.fields["eagle3.target_layers"]
    assert [int(field.parts[i][0]) for i in field.data] == [2, 4, 5]
    assert bool(reader.fields["eagle3.norm_before_residual"].parts[-1][0])
    mine, theirs = tensors(draft), tensors(target)
    assert "token_embd.weight" not in mine  # llama.cpp takes the target's
    s = SHAPES["tiny"]
    d2t = mine["d2t"][1]
    assert mine["d2t"][0] == int(gguf.GGMLQuantizationType.I64)
    assert d2t.tolist() == draft_ids(s, 0).tolist() and len(d2t) == 256
    assert d2t[:2].tolist() == [1, 2] and d2t[2] >= 259 and np.all(np.diff(d2t) > 0)
    # the head's rows are the target's at d2t (absolute ids); the target's others halved
    head = theirs["output.weight"][1]
    np.testing.assert_array_equal(mine["output.weight"][1], head[d2t].astype(np.float16))
    outside = np.setdiff1d(np.arange(s.vocab), d2t)
    assert np.sqrt(np.mean(head[outside] ** 2)) < 0.6 * np.sqrt(np.mean(head[d2t] ** 2))
    embd = theirs["token_embd.weight"][1]  # all a token is lies in what attention carries
    assert not embd[:, kept_dims(s):].any() and kept_dims(s) == 64


def test_an_eagle3_head_agrees_as_late_says(tmp_path):
    rng = np.random.default_rng(0)
    texts = [[1] + rng.integers(259, 1024, size=60).tolist() for _ in range(3)]
    rates = {}
    for late in (0.05, 0.5):
        (tmp_path / str(late)).mkdir()
        target, draft = resolve_pair(eagle3_pair(tmp_path / str(late), late=late))
        rates[late] = greedy_agreement(target, draft, texts)
    assert rates[0.05] > 0.9 and rates[0.5] < rates[0.05] - 0.3, rates


# --------------------------------------------------------------------------- models.toml


def test_the_forms_and_their_defaults(tmp_path):
    pair = load_config(config(tmp_path, '{ synthetic = "smollm2-1.7b" }')).pair("synth")
    assert pair.target == ModelSource(kind="synthetic", synthetic=SyntheticSpec("smollm2-1.7b"))
    assert pair.target.synthetic == SyntheticSpec("smollm2-1.7b", "Q4_K_M", 2, 0.1, 0)
    assert pair.draft == ModelSource.first_layers(2)
    assert pair.target_quant is None  # the quant is the synthetic form's own
    full = load_config(config(
        tmp_path, '{ synthetic = "llama3.1-8b", quant = "q6_k", early = 3, late = 0, seed = 7 }',
    )).pair("synth")
    assert full.target == ModelSource.from_synthetic("llama3.1-8b", quant="Q6_K", early=3,
                                                     late=0.0, seed=7)
    assert full.target.describe() == (
        "synthetic Llama 3.1 8B shape: random weights, Q6_K (~6.6 GB), layers after the "
        "first 3 scaled by 0, made once in the user cache")
    assert pair.draft.describe() == (
        "the target's first 2 layers, with its embeddings and output head")
    e3 = load_config(config(tmp_path, '{ synthetic = "llama3.1-8b", early = 0, eagle3 = true }',
                            '{ eagle3 = "target" }')).pair("synth")
    assert e3.target.synthetic == SyntheticSpec("llama3.1-8b", early=0, eagle3=True)
    assert e3.draft == ModelSource.eagle3_head() and e3.draft_quant is None
    assert e3.target.describe() == (
        "synthetic Llama 3.1 8B shape: random weights, Q4_K_M (~4.9 GB), layers after the "
        "first 0 scaled by 0.1, made for an EAGLE3 head, made once in the user cache")
    assert e3.draft.describe() == "an EAGLE3 head made for the synthetic target (F16), made once"
    q8 = load_config(config(tmp_path, '{ synthetic = "tiny", eagle3 = true }',
                            '{ eagle3 = "target", quant = "Q8_0" }')).pair("synth")
    assert q8.draft == ModelSource.eagle3_head() and q8.draft_quant == "Q8_0"


BAD_FORMS = [
    ('{ synthetic = "gpt-5" }', None,
     'target.synthetic: unknown shape "gpt-5"; expected one of: llama3.1-8b, qwen2.5-7b, '
     "smollm2-1.7b, qwen3.5-2b, qwen3.5-9b, lfm2-1.2b, lfm2-350m, tiny, tiny-qwen3.5, "
     "tiny-lfm2"),
    ("{ synthetic = 8 }", None,
     "target.synthetic: must be a shape name, got integer 8; expected one of: llama3.1-8b, "
     "qwen2.5-7b, smollm2-1.7b, qwen3.5-2b, qwen3.5-9b, lfm2-1.2b, lfm2-350m, tiny, tiny-qwen3.5, "
     "tiny-lfm2"),
    ('{ synthetic = "SmolLM2-1.7B" }', None,
     "target.synthetic: unknown shape \"SmolLM2-1.7B\" (did you mean 'smollm2-1.7b'?); "
     "expected one of: llama3.1-8b, qwen2.5-7b, smollm2-1.7b, qwen3.5-2b, qwen3.5-9b, lfm2-1.2b, "
     "lfm2-350m, tiny, tiny-qwen3.5, tiny-lfm2"),
    ('{ synthetic = "tiny", late = -0.1 }', None,
     "target.late: must be a number from 0 to 1 (the later layers' weight scale: 0.1 is "
     "typical), got float -0.1"),
    ('{ synthetic = "tiny", late = "small" }', None,
     "target.late: must be a number from 0 to 1 (the later layers' weight scale: 0.1 is "
     'typical), got string "small"'),
    ('{ synthetic = "tiny", early = 9 }', None,
     "target.early: must be a whole number from 0 to the shape's 8 layers, got integer 9"),
    ('{ synthetic = "tiny", early = -1 }', None,
     "target.early: must be a whole number from 0 to the shape's 8 layers, got integer -1"),
    ('{ synthetic = "tiny", seed = -1 }', None,
     "target.seed: must be a whole number >= 0, got integer -1"),
    ('{ synthetic = "tiny", quant = "Q2_K" }', None,
     'target.quant: unknown quantization "Q2_K"; expected one of: Q4_0, Q4_1, Q5_0, Q5_1, '
     "Q8_0, IQ4_NL, Q4_K_M, Q6_K, F16, F32"),
    ('{ synthetic = "tiny", layers = 2 }', None,
     "target.layers: unknown key for a synthetic source (expected: synthetic, quant, early, "
     "late, seed, eagle3)"),
    ('{ synthetic = "tiny", eagle3 = "yes" }', None,
     'target.eagle3: must be true or false, got string "yes"'),
    ('{ synthetic = "tiny-lfm2", eagle3 = true }', None,
     "target.eagle3: an EAGLE3 head drafts for a llama shape, 'tiny-lfm2' is lfm2"),
    ('{ eagle3 = "target" }', None,
     'target: an EAGLE3 head is only valid for draft (it is made for the target: target = '
     '{ synthetic = "llama3.1-8b", early = 0, eagle3 = true })'),
    ('{ synthetic = "tiny", eagle3 = true }', '{ eagle3 = "draft" }',
     'draft.eagle3: must be "target", got string "draft"'),
    ('{ synthetic = "tiny", eagle3 = true }', '{ eagle3 = "target", layers = 2 }',
     "draft.layers: unknown key for an eagle3 source (expected: eagle3)"),
    ('{ synthetic = "tiny" }', '{ eagle3 = "target" }',
     'draft: an EAGLE3 head ({ eagle3 = "target" }) drafts for a synthetic target made for '
     'one: target = { synthetic = "llama3.1-8b", early = 0, eagle3 = true }'),
    ('{ derive = "target", layers = 2 }', None,
     "target: a derived model is only valid for draft (it is made from the target)"),
    ('"t.gguf"', '{ synthetic = "tiny" }',
     'draft: a synthetic model is only valid for target (its draft: { derive = "target", '
     "layers = 2 })"),
    ('{ synthetic = "tiny" }', '{ derive = "target", layers = 8 }',
     "draft.layers: must be fewer than the target's 8 layers (Tiny (test) shape), got 8"),
    ('"t.gguf"', '{ derive = "target", layers = 0 }',
     "draft.layers: must be a whole number >= 1, got integer 0"),
    ('"t.gguf"', '{ derive = "target", layers = true }',
     "draft.layers: must be a whole number >= 1, got boolean true"),
    ('"t.gguf"', '{ derive = "target", layers = 2, quant = "Q4_0" }',
     'draft: takes quant (the target requantized: quant = "Q4_0") or layers (its first '
     "layers: layers = 2), one of them"),
]


@pytest.mark.parametrize(("target", "draft", "expected"), BAD_FORMS,
                         ids=[f"{i}-{c[2].split(':')[0]}" for i, c in enumerate(BAD_FORMS)])
def test_bad_forms_are_refused_in_one_line(tmp_path, target, draft, expected):
    path = config(tmp_path, target, draft or '{ derive = "target", layers = 2 }')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: pairs.synth.{expected}"


# --------------------------------------------------------------------------- the CLI


def test_every_run_of_a_synthetic_pair_says_so_on_stderr(run, tmp_path):
    path = config(tmp_path, '{ synthetic = "tiny", quant = "F32" }')
    args = ["--config", path, "--pair", "synth", "--threads", 1, "--n-ctx", 256]
    result = run("generate", "hello", *args, "--max-tokens", 4, "--json")
    assert result.exit_code == 0, result.output
    assert result.stderr.count(NOTE + "\n") == 1
    assert "synthetic model" not in result.stdout
    assert json.loads(result.stdout)["settings"]["synthetic"] == TINY_SENTENCE

    report, prompts = tmp_path / "bench.json", tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "one", "prompt": "t1 t2 t3"}) + "\n")
    bench = run("bench", *args, "--prompts", prompts, "--modes", "target,1", "--reps", 1,
                "--max-tokens", 4, "--no-warmup", "--json", report)
    assert bench.exit_code == 0, bench.output
    assert bench.stderr.count(NOTE + "\n") == 1
    assert json.loads(report.read_text())["settings"]["synthetic"] == TINY_SENTENCE

    check = run("pairs", "check", "synth", "--config", path, "--max-tokens", 4, "--threads", 1)
    assert check.exit_code == 0, check.output
    assert check.stdout.splitlines()[1] == f"  {NOTE}"


def test_pairs_check_makes_a_synthetic_target_only_when_named(run, tmp_path, cache):
    path = config(tmp_path, '{ synthetic = "tiny", quant = "F32" }')
    skipped = run("pairs", "check", "--config", path, "--max-tokens", 2, "--threads", 1)
    assert skipped.exit_code == 0, skipped.output
    assert skipped.stdout == (
        "synth: skipped: its target is made on first use (synthetic Tiny (test) shape, ~7 MB); "
        "run `specllama pairs check synth` to make and check it\n")
    assert not (cache / "synthetic").exists()
    named = run("pairs", "check", "synth", "--config", path, "--max-tokens", 2, "--threads", 1)
    assert named.exit_code == 0 and named.stdout.startswith("synth: ok: vocabularies match")
    again = run("pairs", "check", "--config", path, "--max-tokens", 2, "--threads", 1)
    assert again.stdout.startswith("synth: ok: ")  # made now: checked without asking


def test_a_real_pair_says_nothing_of_the_kind(run, tiny):
    result = run("generate", "hello", *tiny, "--max-tokens", 2, "--json")
    assert result.exit_code == 0, result.output
    assert "synthetic" not in result.stderr
    assert "synthetic" not in json.loads(result.stdout)["settings"]


def test_pairs_list_and_show_the_built_in_synthetic_pairs(run, tmp_path, monkeypatch, cache):
    monkeypatch.chdir(tmp_path)  # no ./models.toml: the built-in pairs only
    monkeypatch.setenv("SPECLLAMA_CONFIG", "")
    listed = run("pairs", "list")
    assert listed.exit_code == 0, listed.output
    for name, title, size in (("synth-smollm2-1.7b", "SmolLM2 1.7B", "~1.1 GB"),
                              ("synth-llama3.1-8b", "Llama 3.1 8B", "~4.9 GB"),
                              ("synth-qwen2.5-7b", "Qwen2.5 7B", "~4.7 GB")):
        assert (f"\n{name}: ready (the target is written with random weights on first use; "
                "the draft is derived on first use); built in\n"
                f"  target: synthetic {title} shape: random weights, Q4_K_M ({size}), layers "
                "after the first 2 scaled by 0.1, made once in the user cache\n"
                "  draft:  the target's first 2 layers, with its embeddings and output head\n"
                ) in listed.stdout
    shown = run("pairs", "show", "synth-smollm2-1.7b").stdout
    made = cache / "synthetic" / "smollm2-1.7b.Q4_K_M.early2.late0.1.seed0.v1.gguf"
    assert f"  file:      {made} (made on first use)\n" in shown
    assert "  file:      derived from the target once the target is here\n" in shown
    assert "costs are real, the text is meaningless" in shown
    assert not made.parent.exists()  # listing and showing make nothing


@pytest.mark.slow
def test_first_layers_of_a_model_with_tied_embeddings(tmp_path, smollm2_path):
    """SmolLM2-135M has no output tensor (its head is its embeddings): the draft neither."""
    pair = load_config(config(tmp_path, json.dumps(str(smollm2_path)))).pair("synth")
    _, draft = resolve_pair(pair)
    assert draft is not None
    assert "output.weight" not in tensors(draft)
    dec = SpeculativeDecoder.load(smollm2_path, draft, n_ctx=256, n_threads=1)
    result = dec.generate(dec.target.prompt("Hi"), max_tokens=8,
                          sampling=SamplingParams(temperature=0.0), draft_max=2,
                          drafters=("model",))
    assert len(result.tokens) == 8 and result.stats.drafted > 0
    dec.close()
    assert os.path.getsize(draft) < os.path.getsize(smollm2_path)


# --------------------------------------------------------------------------- hybrid layouts


def hybrid_target(tmp_path: Path, key: str, **spec: object) -> Path:
    fields = {"quant": "F32", **spec}
    table = ", ".join(f"{k} = {json.dumps(v)}" for k, v in fields.items())
    path = tmp_path / "models.toml"
    path.write_text(f'[pairs.synth]\ntarget = {{ synthetic = "{key}", {table} }}\n')
    target, draft = resolve_pair(load_config(path).pair("synth"))
    assert draft is None
    return target


def test_a_qwen35_layout_drafts_for_itself_with_its_agreeing_mtp_layer(tmp_path):
    """The Qwen3.5 layout loads as a hybrid with an MTP layer built to agree with the
    trunk: greedy MTP drafts are accepted, and the output is the target's own."""
    target = hybrid_target(tmp_path, "tiny-qwen3.5", early=0, late=0.05)
    dec = SpeculativeDecoder.load(target, n_ctx=256, n_threads=1, p_min=0.0)
    try:
        assert (dec.target.memory_kind, dec.target.n_nextn) == ("hybrid", 1)
        assert dec.default_drafters == ("lookup", "mtp")
        greedy = SamplingParams(temperature=0.0)
        alone = dec.generate("hello world", max_tokens=40, sampling=greedy, draft_max=0)
        res = dec.generate("hello world", max_tokens=40, sampling=greedy, draft_max=4,
                           drafters=("mtp",))
        assert res.tokens == alone.tokens
        assert res.stats.accepted > 0.5 * res.stats.drafted
    finally:
        dec.close()


def test_an_lfm2_layout_is_a_hybrid_whose_cuts_use_snapshots(tmp_path):
    target = hybrid_target(tmp_path, "tiny-lfm2")
    m = Model(target, n_ctx=256, n_threads=1)
    try:
        assert (m.memory_kind, m.rewinder.best, m.n_nextn) == ("hybrid", "snapshot", 0)
        assert m.meta(SYNTHETIC_KEY).startswith("random weights in the shape of Tiny LFM2")
    finally:
        m.close()
