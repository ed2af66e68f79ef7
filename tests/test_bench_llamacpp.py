"""bench/llamacpp.py without building llama.cpp: parsing the tools' output, captured from
the llama.cpp of llama-cpp-python 0.3.36, and the summary."""

import pytest

from bench import llamacpp as lcpp
from bench.lib.llamacpp_build import corpus_texts, no_amx_flags, numbers

# The end of llama-speculative-simple's stderr (SmolLM2-135M Q4_1 drafted by its Q4_0,
# -n 16 --spec-draft-n-max 3 --temp 0, -t 2 on a busy 2-core machine, hence the speed).
SPECULATIVE_STDERR = """\
0.00.950.763 I cmn          init: llama threadpool init, n_threads = 2
0.02.347.603 I common_speculative_init_result: loading draft model '/root/.cache/specllama/derived/SmolLM2-135M-Instruct.Q4_1.Q4_0.44117fa3e678.gguf'
1.28.162.107 I encoded   10 tokens in    4.127 seconds, speed:    2.423 t/s
1.28.162.144 I decoded   20 tokens in   78.113 seconds, speed:    0.256 t/s
1.28.162.172 I 
1.28.162.198 I n_draft   = 3
1.28.162.225 I n_predict = 20
1.28.162.252 I n_drafted = 26
1.28.162.278 I n_accept  = 11
1.28.162.306 I accept    = 42.308%
1.28.162.332 I 
1.28.162.359 I draft:

1.28.162.455 I 
1.28.162.483 I target:

1.28.162.517 I common_perf_print:    sampling time =       5.77 ms
1.28.162.544 I common_perf_print:    samplers time =       1.68 ms /    20 tokens
1.28.162.579 I common_perf_print:        load time =    1677.87 ms
1.28.162.609 I common_perf_print: prompt eval time =   39773.46 ms /    46 tokens (  864.64 ms per token,     1.16 tokens per second)
1.28.162.638 I common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)
1.28.162.667 I common_perf_print:       total time =   85815.07 ms /    47 tokens
"""  # noqa: E501, W291

# `llama-bench -m SmolLM2-135M-Instruct.Q4_1.gguf -p 0 -n 8 -t 1 -r 1 -o json` (stdout)
LLAMA_BENCH_JSON = """\
[
  {
    "build_commit": "unknown",
    "build_number": 0,
    "cpu_info": "Intel(R) Xeon(R) Processor @ 2.00GHz",
    "backends": "CPU",
    "model_type": "llama 256M Q4_1",
    "n_threads": 1,
    "n_prompt": 0,
    "n_gen": 8,
    "n_depth": 0,
    "test_time": "2026-12-01T05:46:21Z",
    "avg_ns": 276810227,
    "stddev_ns": 0,
    "avg_ts": 28.900666,
    "stddev_ts": 0.000000,
    "samples_ns": [ 276810227 ],
    "samples_ts": [ 28.9007 ]
  }
]
"""


def test_parse_speculative():
    r = lcpp.parse_speculative(SPECULATIVE_STDERR)
    assert r == {"prompt_tokens": 10, "tokens": 20, "decode_s": 78.113, "tokens_per_s": 0.256,
                 "n_draft": 3, "drafted": 26, "accepted": 11, "acceptance": 11 / 26}


def test_parse_speculative_without_prefix_and_without_drafts():
    # older llama.cpp printed no log prefix; no draft at all leaves acceptance undefined
    text = "\n".join(line[15:] for line in SPECULATIVE_STDERR.splitlines()[2:10])
    text = text.replace("n_drafted = 26", "n_drafted = 0")
    assert lcpp.parse_speculative(text)["acceptance"] is None


def test_parse_speculative_rejects_a_failed_run():
    with pytest.raises(ValueError):
        lcpp.parse_speculative("error: failed to load model\n")


def test_parse_llama_bench():
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert lcpp.parse_llama_bench(LLAMA_BENCH_JSON)["avg_ts"] == pytest.approx(28.900666)


def test_sampling_flags_turn_llama_cpp_samplers_off():
    assert lcpp.sampling_flags(0.0) == ["--temp", "0"]
    assert lcpp.sampling_flags(0.8) == ["--temp", "0.8", "--top-k", "0", "--top-p", "1",
                                        "--min-p", "0"]


def test_summarize_picks_the_best_settings():
    modes = {"target": 30.0, "auto": 33.0, "k=1": 20.0, "k=2": 25.0, "k=3": 22.0}
    report = {"runs": [{"prompt": p, "mode": m, "tokens_per_s": v * f}
                       for p, f in (("a", 1.0), ("b", 2.0)) for m, v in modes.items()]}
    runs = [{"prompt": p, "temperature": 0.0, "setting": s, "tokens_per_s": v * f,
             "drafted": 10, "accepted": acc}
            for p, f in (("a", 1.0), ("b", 2.0))
            for s, v, acc in (("n-max 3, p-min 0", 11.0, 6), ("n-max 8, p-min 0", 15.0, 8))]
    s = lcpp.summarize(0.0, ["a", "b"], [report], runs, [{"avg_ts": 29.0}])
    assert s["best_fixed_k"] == "k=2"
    assert s["llamacpp_best_setting"] == "n-max 8, p-min 0"
    assert s["per_prompt"]["b"]["llamacpp_spec"] == 30.0
    assert s["per_prompt"]["a"]["llamacpp_acceptance"] == 0.8
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert s["overall"]["auto_vs_llamacpp_spec"] == pytest.approx(33.0 / 15.0)
    assert s["llama_bench_tg"] == 29.0


def test_a_cpu_with_amx_builds_without_llama_cpps_amx_kernels():
    assert no_amx_flags("flags : fpu sse avx2 amx_tile amx_int8 amx_bf16") == [
        "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
        "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"]
    assert no_amx_flags("flags : fpu sse avx2") == []


def test_sweeps_are_comma_separated_numbers():
    assert numbers("2,3,4", int) == [2, 3, 4]
    assert numbers("0,0.75") == [0.0, 0.75]
    assert numbers("") == []  # no draft-model contenders at all


def test_the_corpus_is_its_text_files_in_order_without_hidden_ones(tmp_path):
    (tmp_path / "b.txt").write_text("second")
    (tmp_path / "a.md").write_text("first")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("hidden")
    (tmp_path / "blob.bin").write_bytes(b"\0\1\2")
    single = tmp_path / "b.txt"
    assert corpus_texts([tmp_path]) == ["first", "second"]
    assert corpus_texts([single]) == ["second"]


def test_specllama_bench_runs_with_the_same_pair_and_drafters():
    args = lcpp.arguments().parse_args(["--pair", "smollm2", "--reps", "1"])
    assert args.drafters == "model"  # like for like: llama.cpp's tool drafts with the model
    cmd = lcpp.specllama_cmd(args, lcpp.Path("p.jsonl"), 0.8, 3, lcpp.Path("o.json"))
    assert cmd[cmd.index("--pair") + 1] == "smollm2"
    assert cmd[cmd.index("--drafters") + 1] == "model"
    assert cmd[cmd.index("--seed") + 1] == "3" and cmd[cmd.index("--temperature") + 1] == "0.8"
