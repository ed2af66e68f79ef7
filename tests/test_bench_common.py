"""bench/lib/common.py: a pair resolved as `specllama` resolves it, the options every script
takes, the spread of repeated figures; and every script starts (`--help`).

`pytest.approx` at its default (relative 1e-6) compares float64 arithmetic done two ways
(a formula against the code's), whose rounding is ~1e-15: far inside it."""

import argparse
import importlib
import sys
from pathlib import Path

import pytest

from bench.lib import common
from bench.lib.common import Spread, geomean, percentile, ratios
from specllama import SpeculativeDecoder

SCRIPTS = ["ablation", "ablation_real", "ceiling", "chatturns", "concurrency", "contextcost",
           "crossvocab", "eagle3", "following", "gemma4_assistant", "infill", "isolation",
           "laptop",
           "llamacpp", "llamaserver", "maskcost", "hybrid", "overhead", "promptcache",
           "rpc_latency",
           "sequence", "soak", "suffixcost"]


def test_bench_holds_scripts_at_the_top_and_what_they_share_in_lib():
    bench = Path(__file__).parents[1] / "bench"
    found = {p.stem for p in bench.glob("*.py")} | {p.parent.name for p in
                                                    bench.glob("*/__main__.py")}
    assert found == {"__init__"} | set(SCRIPTS)
    assert not any("main" in vars(importlib.import_module(f"bench.lib.{p.stem}"))
                   for p in (bench / "lib").glob("*.py")), "a script hides in bench/lib"


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_starts_and_explains_itself(name, monkeypatch, capsys):
    script = importlib.import_module(f"bench.{name}")
    monkeypatch.setattr(sys, "argv", [f"bench/{name}.py", "--help"])
    with pytest.raises(SystemExit) as done:
        script.main()
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m bench.{name}")


def test_a_spread_is_the_median_and_the_extremes():
    s = Spread.of([1.2, 0.9, 1.5, 1.0])
    assert (s.min, s.median, s.max) == (0.9, pytest.approx(1.1), 1.5)
    assert s.bracket() == "1.10 [0.90-1.50]"
    assert s.slashed() == "0.900 / 1.100 / 1.500"
    assert s.as_dict() == {"min": 0.9, "median": 1.1, "max": 1.5}
    with pytest.raises(ValueError):
        Spread.of([])


def test_means_ratios_and_percentiles():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([0.0, 4.0]) == pytest.approx(4.0)  # a run that produced nothing: left out
    assert geomean([]) == 0.0
    assert ratios([30.0, 20.0], [10.0, 40.0]) == [3.0, 0.5]
    with pytest.raises(ValueError):
        ratios([1.0], [1.0, 2.0])  # a repetition missing on one side is a bug, not a figure
    xs = [float(x) for x in range(1, 21)]
    assert percentile(xs, 50) == 10.0 and percentile(xs, 95) == 19.0
    assert percentile(xs, 100) == 20.0 and percentile([], 95) is None


def options(*argv: str) -> argparse.Namespace:
    p = common.parser(None)
    common.add_pair_options(p)
    common.add_run_options(p, reps=3, max_tokens=64, temperature=0.8, json=True)
    return p.parse_args(list(argv))


def test_the_common_options_and_the_pair_as_another_commands_flags():
    args = options()
    assert (args.pair, args.threads, args.reps, args.max_tokens, args.temperature,
            args.json) == ("smollm2-f32", 2, 3, 64, 0.8, None)
    assert common.model_flags(args) == ["--pair", "smollm2-f32"]
    assert common.model_flags(options("--pair", "p", "--config", "m.toml")) == \
        ["--pair", "p", "--config", "m.toml"]
    assert common.model_flags(options("--target", "t.gguf", "--draft", "lookup")) == \
        ["--target", "t.gguf", "--draft", "lookup"]


@pytest.fixture
def models_toml(tmp_path, tiny_target, tiny_draft):
    path = tmp_path / "models.toml"
    path.write_text(f'[pairs.tiny]\ntarget = "{tiny_target}"\ndraft = "{tiny_draft}"\n\n'
                    f'[pairs.tiny-lookup]\ntarget = "{tiny_target}"\ndraft = "lookup"\n')
    return path


def test_a_pair_resolves_by_name_from_models_toml(models_toml, tiny_target, tiny_draft):
    args = options("--pair", "tiny", "--config", str(models_toml), "--threads", "1")
    assert common.resolve_models(args) == (tiny_target, tiny_draft)
    dec = common.load_decoder(args, n_ctx=256)
    try:
        assert isinstance(dec, SpeculativeDecoder) and dec.draft is not None
        assert dec.target.n_threads == 1
    finally:
        dec.close()
    lookup = options("--pair", "tiny-lookup", "--config", str(models_toml))
    assert common.resolve_models(lookup) == (tiny_target, None)


def test_files_given_instead_of_a_pair(tiny_target, tiny_draft):
    args = options("--target", str(tiny_target), "--draft", str(tiny_draft))
    assert common.resolve_models(args) == (tiny_target, tiny_draft)
    assert common.resolve_models(options("--target", str(tiny_target), "--draft",
                                         "lookup")) == (tiny_target, None)


def test_bad_input_is_one_line_and_exit_status_2(models_toml, tiny_target, capsys):
    def main(*argv: str, need_draft: bool = False) -> None:
        common.resolve_models(options(*argv), need_draft=need_draft)

    cases = [(("--pair", "nope", "--config", str(models_toml)), False, "no pair named 'nope'"),
             (("--draft", str(tiny_target)), False, "--draft needs --target"),
             (("--pair", "tiny-lookup", "--config", str(models_toml)), True,
              "needs a draft model")]
    for argv, need_draft, message in cases:
        with pytest.raises(SystemExit) as done:
            common.run(lambda: main(*argv, need_draft=need_draft))  # noqa: B023
        assert done.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_the_machine_is_named_with_its_cores():
    assert common.machine().endswith(" cores)")
