"""`specllama bench` with the tiny models: prompts and modes parsing, the
interleaved run, a well-formed JSON report and a plot."""

import json

import pytest
from click.testing import CliRunner

from specllama import InvalidParameterError, SamplingParams, SpeculativeDecoder
from specllama.cli.bench_command import (
    BenchPrompt,
    bench_command,
    builtin_prompts,
    load_prompts,
    parse_modes,
    parse_prompts,
    render_tables,
    run_bench,
    summarize,
    write_json,
    write_plot,
)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLLAMA_CACHE_DIR", str(tmp_path / "cache"))


# ----------------------------------------------------------------------------- parsing


def test_parse_modes():
    modes = parse_modes("target, 1,k=2,k4, auto,heuristic,2")
    assert [m.name for m in modes] == ["target", "k=1", "k=2", "k=4", "auto", "heuristic"]
    assert [m.draft_max for m in modes] == [0, 1, 2, 4, "auto", "heuristic"]
    assert parse_modes("0")[0].name == "target"
    for bad in ("fast", "k=0x", "65", "", "-1"):
        with pytest.raises(InvalidParameterError):
            parse_modes(bad)


def test_parse_modes_with_their_own_drafters():
    modes = parse_modes("target,auto@lookup>model, 4@lookup+model,auto,context@lookup,"
                        "target@model")
    assert [m.name for m in modes] == ["target", "auto@lookup>model", "k=4@lookup+model",
                                       "auto", "context@lookup"]
    assert (modes[1].draft_max, modes[1].drafters) == ("auto", ("lookup>model",))
    assert (modes[2].draft_max, modes[2].drafters) == (4, ("lookup", "model"))
    assert modes[3].drafters is None  # the run's --drafters
    assert modes[4].draft_cache is False and modes[4].drafters == ("lookup",)
    for bad in ("auto@", "auto@magic", "2@model+model", "auto@lookup>model+model"):
        with pytest.raises(InvalidParameterError):
            parse_modes(bad)


def test_parse_prompts_jsonl_and_lines():
    jsonl = '{"id": "a", "prompt": "hi", "category": "chat"}\n\n# note\n"plain string"\n'
    ps = parse_prompts(jsonl)
    assert ps == [BenchPrompt("a", "hi", "chat"), BenchPrompt("p4", "plain string")]
    lines = parse_prompts("first prompt\nsecond one\n")
    assert [p.prompt for p in lines] == ["first prompt", "second one"]
    assert parse_prompts('{"prompt": "x", "chat": false}')[0].chat is False


@pytest.mark.parametrize("text", [
    "", "# only a comment\n", '{"id": "a"}', '{"prompt": 3}', '{"prompt": "x"',
    '{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}', '{"prompt": "  "}',
    '{"prompt": "x", "chat": "yes"}',
])
def test_parse_prompts_errors(text):
    with pytest.raises(InvalidParameterError):
        parse_prompts(text)


def test_builtin_prompts_cover_the_tasks():
    ps = builtin_prompts()
    assert {"chat", "code", "summarize", "rewrite"} <= {p.category for p in ps}
    assert len({p.id for p in ps}) == len(ps)
    by_cat = {p.category: p for p in ps}
    assert len(by_cat["summarize"].prompt) > 400 and len(by_cat["rewrite"].prompt) > 200


def test_a_folder_named_like_a_built_in_set_does_not_hide_it(tmp_path, monkeypatch):
    """`--prompts bench` in a checkout of this project (which has a bench/ folder) is the
    built-in set; a file of that name is the user's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bench").mkdir()
    assert load_prompts("bench") == builtin_prompts("bench")
    (tmp_path / "copy").write_text("my own prompt\n")
    assert [p.prompt for p in load_prompts("copy")] == ["my own prompt"]


# ----------------------------------------------------------------------------- running


@pytest.fixture(scope="module")
def report(tiny_target, tiny_draft, tmp_path_factory):
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=512, n_threads=1, p_min=0.0)
    prompts = [BenchPrompt("one", "the cat sat on the"), BenchPrompt("two", "Once upon a time")]
    seen = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECLLAMA_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        rep = run_bench(dec, prompts, parse_modes("target,2,auto"), reps=2, max_tokens=12,
                        sampling=SamplingParams(temperature=0.8, seed=5), progress=seen.append,
                        max_foreign=None)  # CI machines are busy; the exclusion has its own test
    dec.close()
    rep["_progress"] = seen
    return rep


def test_run_bench_runs_everything_interleaved(report):
    runs = report["runs"]
    assert len(runs) == 2 * 2 * 3
    for pid in ("one", "two"):
        for rep in (0, 1):
            group = [r for r in runs if r["prompt"] == pid and r["rep"] == rep]
            assert sorted(r["mode"] for r in group) == ["auto", "k=2", "target"]
            assert {r["seed"] for r in group} == {5 + rep}  # same seed for every mode
    first = [r["mode"] for r in runs[:3]]
    second = [r["mode"] for r in runs[3:6]]
    assert first != second and sorted(first) == sorted(second)  # order rotates
    assert all(0 < r["tokens"] <= 12 for r in runs)
    assert all(r["generate_s"] > 0 and r["tokens_per_s"] > 0 for r in runs)
    assert all(r["drafted"] == 0 for r in runs if r["mode"] == "target")
    assert any(r["drafted"] > 0 for r in runs if r["mode"] == "k=2")
    assert any("calibrating" in m for m in report["_progress"])


def test_report_summary(report):
    summary = report["summary"]
    per = summary["per_prompt"]["one"]
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert per["target"]["vs_target"] == pytest.approx(1.0)
    assert per["best_fixed"] == "k=2"
    assert per["k=2"]["vs_best_fixed"] == pytest.approx(1.0)
    assert len(per["auto"]["tokens_per_s_all"]) == 2
    overall = summary["overall"]
    assert set(overall) == {"target", "k=2", "auto"}
    assert overall["target"]["acceptance_rate"] is None
    assert 0.0 <= overall["k=2"]["acceptance_rate"] <= 1.0
    assert len(overall["k=2"]["acceptance_by_position"]) == 2
    for o in overall.values():
        assert 0.0 <= o["overhead_share_median"] <= 1.0
    assert overall["auto"]["policy_note"].startswith("auto: ")
    assert report["calibration"]["target"]["curve"]["seconds"]
    assert report["settings"]["reps"] == 2 and report["settings"]["max_tokens"] == 12


def test_report_is_json_and_plots(report, tmp_path):
    path = tmp_path / "bench.json"
    clean = {k: v for k, v in report.items() if not k.startswith("_")}
    write_json(clean, path)
    data = json.loads(path.read_text())
    assert data["version"] == 1 and len(data["runs"]) == 12
    for key in ("generate_s", "target_s", "draft_s", "overhead_s", "prompt_s",
                "drafted_at", "accepted_at", "draft_lengths", "policy_note", "finish_reason",
                "foreign_cpu"):
        assert key in data["runs"][0]
    tables = render_tables(data)
    assert len(tables) == 2
    pytest.importorskip("matplotlib",
                        reason="--plot draws with matplotlib: pip install -e '.[test]'")
    png = tmp_path / "bench.png"
    write_plot(data, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_bench_rejects_bad_input(tiny_target):
    dec = SpeculativeDecoder.load(tiny_target, None, n_ctx=256, n_threads=1, p_min=0.0)
    with pytest.raises(InvalidParameterError):
        run_bench(dec, [], parse_modes("target"))
    with pytest.raises(InvalidParameterError):
        run_bench(dec, [BenchPrompt("a", "x")], parse_modes("target"), reps=0)
    dec.close()


def test_a_mode_drafts_with_its_own_drafters(tiny_target, tiny_draft):
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=256, n_threads=1, p_min=0.0)
    try:
        rep = run_bench(dec, [BenchPrompt("a", "the cat sat on the")],
                        parse_modes("2@model,2@lookup"), reps=1, max_tokens=12, warmup=False,
                        sampling=SamplingParams(temperature=0.0, seed=1), max_foreign=None)
    finally:
        dec.close()
    by_mode = {r["mode"]: r for r in rep["runs"]}
    model, lookup = by_mode["k=2@model"], by_mode["k=2@lookup"]
    assert model["drafted"] > 0 and sum(model["origin_drafted"].values()) == 0
    assert lookup["drafted"] == sum(lookup["origin_drafted"].values())  # copies only
    assert [m["drafters"] for m in rep["modes"]] == [("model",), ("lookup",)]


def test_a_mode_whose_drafters_the_pair_lacks_fails_before_running(tiny_target):
    dec = SpeculativeDecoder.load(tiny_target, "lookup", n_ctx=256, n_threads=1)
    try:
        with pytest.raises(InvalidParameterError, match="need a draft model"):
            run_bench(dec, [BenchPrompt("a", "x")], parse_modes("target,auto@model"))
    finally:
        dec.close()


# ----------------------------------------------------------------------------- the command


def test_bench_command(tiny_target, tiny_draft, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat sat on the\nHello world\n")
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    args = ["--target", str(tiny_target), "--draft", str(tiny_draft), "--threads", "1",
            "--n-ctx", "256", "--prompts", str(prompts), "--modes", "target,1,auto",
            "--reps", "1", "--max-tokens", "6", "--no-warmup", "--json", str(out_json)]
    try:
        import matplotlib  # noqa: F401

        args += ["--plot", str(out_png)]
    except ImportError:
        out_png = None
    result = CliRunner().invoke(bench_command, args)
    assert result.exit_code == 0, result.output
    assert "tokens/s" in result.output and "overall" in result.output
    data = json.loads(out_json.read_text())
    assert [p["id"] for p in data["prompts"]] == ["p1", "p2"]
    assert len(data["runs"]) == 2 * 3
    assert data["settings"]["threads"] == 1
    if out_png is not None:
        assert out_png.read_bytes()[:4] == b"\x89PNG"


def test_bench_command_bad_modes(tiny_target, tiny_draft):
    result = CliRunner().invoke(bench_command, ["--target", str(tiny_target), "--draft",
                                                str(tiny_draft), "--modes", "fast"])
    assert result.exit_code != 0
    assert isinstance(result.exception, InvalidParameterError)


def fake_run(prompt, mode, rep, tps, foreign=0.0):
    return {"prompt": prompt, "mode": mode, "rep": rep, "tokens_per_s": tps, "tokens": 10,
            "overhead_share": 0.01, "overhead_s": 0.001, "generate_s": 10 / tps, "drafted": 0,
            "accepted": 0, "target_steps": 10, "drafted_at": [], "accepted_at": [],
            "reached_at": [], "policy_note": "", "foreign_cpu": foreign}


def test_summary_pairs_by_repetition_and_drops_busy_ones():
    modes = parse_modes("target,2")
    runs = [
        # the machine drifts between repetitions; within one, k=2 is always 0.5x
        fake_run("a", "target", 0, 100.0), fake_run("a", "k=2", 0, 50.0),
        fake_run("a", "target", 1, 60.0), fake_run("a", "k=2", 1, 30.0),
        fake_run("a", "target", 2, 80.0), fake_run("a", "k=2", 2, 40.0),
        # a busy repetition: left out
        fake_run("a", "target", 3, 10.0, foreign=0.5), fake_run("a", "k=2", 3, 45.0),
    ]
    s = summarize(runs, ["target", "k=2"], ["a"], modes)
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert s["per_prompt"]["a"]["k=2"]["vs_target"] == pytest.approx(0.5)
    assert s["per_prompt"]["a"]["target"]["tokens_per_s"] == 80.0
    assert s["excluded_reps"] == [{"prompt": "a", "rep": 3}]
    kept = summarize(runs, ["target", "k=2"], ["a"], modes, max_foreign=None)
    assert kept["excluded_reps"] == [] and kept["overall"]["target"]["runs"] == 4
