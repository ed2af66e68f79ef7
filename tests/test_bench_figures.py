"""The arithmetic behind the figures docs/performance.md quotes, script by script, on
made-up measurements: no model is loaded and nothing is timed."""

import struct
from types import SimpleNamespace

import numpy as np
import pytest

from bench import (
    ablation,
    ablation_real,
    chatturns,
    contextcost,
    crossvocab,
    following,
    isolation,
    maskcost,
    promptcache,
    rpc_latency,
    sequence,
    suffixcost,
)
from specllama.engine.drafting import following as following_module


def test_ablation_names_workloads_and_compares_each_switch_with_the_full_policy():
    assert ablation.workload_name((0.75, True, 0.0, 1.0, False)) == "0.75c"
    assert ablation.workload_name((0.85, True, 0.03, 1.0, False)) == "0.85cs"
    assert ablation.workload_name((0.65, False, 0.0, 1.2, False)) == "0.65nm"
    assert ablation.workload_name((0.97, True, 0.0, 1.0, True)) == "mtp 0.97 T0.8"
    row = ablation.switch_row("no probes", "probe_k=0", [1.10, 0.95, 1.0], [1.0, 1.0, 1.0])
    assert row == "| no probes (`probe_k=0`) | +10.0% | -5.0% | +0.0% | -5.0% | +10.0% |"


def test_ablation_calls_simulate_auto_on_one_decoder():
    texts = ablation.texts_for(0.95, True, count=1)
    assert ablation.calls(texts, ablation.AutoTuning()) > 1.0  # drafting pays at 95%
    mtp = ablation.copy_head_texts(0.97, False, count=2)
    assert ablation.calls(mtp, ablation.AutoTuning(), machine=ablation.QWEN35_MTP) > 1.2


def test_ablation_real_takes_autos_ratio_and_compares_medians_with_the_full_policy():
    assert ablation_real.auto_ratio(
        {"summary": {"overall": {"auto": {"vs_target_geomean": 1.25}}}}) == 1.25
    switches = [("full policy", ""), ("no probes", "probe_k=0")]
    lines = ablation_real.table(switches, {"full policy": [1.2, 1.0, 1.1],
                                           "no probes": [0.99, 1.1, 0.88]})
    assert lines[2] == "| full policy | 1.000 / 1.100 / 1.200 | +0.0% |"
    assert lines[3] == "| no probes (`probe_k=0`) | 0.880 / 0.990 / 1.100 | -10.0% |"


def test_chatturns_pairs_auto_with_the_target_alone_per_repetition():
    assert chatturns.user_turn("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    lines = chatturns.summary({"auto": [30.0, 22.0, 40.0], "target": [20.0, 20.0, 40.0]},
                              turns=7, context=1500)
    assert lines[0] == "auto    tok/s 30.0 22.0 40.0"
    # ratios 1.5, 1.1, 1.0: the machine's speed differs between repetitions, not within
    assert lines[2] == ("auto / target alone: 1.10 [1.00-1.50] over 3 repetitions; 7 turns, "
                        "1500 tokens of conversation at the end")


def test_contextcost_gives_t1_and_each_size_against_it():
    samples = {(16, 1): [0.010, 0.012, 0.011], (16, 2): [0.019, 0.020, 0.021],
               (512, 1): [0.020], (512, 2): [0.030]}
    assert contextcost.by_context(samples, [16, 512], [1, 2]) == [
        "context    16: T(1)  11.00 ms  T(2) 1.82", "context   512: T(1)  20.00 ms  T(2) 1.50"]
    after = {(s, n): [0.010 * (1 + 0.1 * s) * n] for s in contextcost.STEPS for n in (1, 2)}
    lines = contextcost.after_steps(after, [1, 2])
    assert lines[0] == "after 0 draft steps: T(1)  10.0 ms  T(2)  20.0 ms  (T(1) 1.00x alone)"
    assert lines[2].endswith("(T(1) 1.30x alone)")


def test_crossvocab_takes_the_views_work_out_of_the_draft_time():
    stats = SimpleNamespace(target_steps=10, target_s=0.5, draft_s=0.3)
    rounds, step, model, view, share = crossvocab.round_costs(stats, view_s=0.1)
    assert rounds == 10
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert (step, model, view, share) == pytest.approx((0.05, 0.02, 0.01, 0.2))
    rows = [(10, 0.05, 0.02, 0.01, 0.2), (20, 0.04, 0.01, 0.002, 0.05),
            (30, 0.06, 0.03, 0.003, 0.05)]
    assert crossvocab.median_line(0.8, rows) == \
        "0.8       20      50.0 ms         20.00 ms     3.00 ms          5.0%"


def test_following_costs_per_round_and_against_the_target():
    spent = {"walk": [10e-6] * 19 + [100e-6], "agreed": []}
    lines = following.cost_lines(spent, target_s=2.0, rounds=100)
    assert lines == ["walk       20 calls, median   10.0 us, p95   10.0 us",
                     "100 rounds, 20.0 ms a verify pass; following 3 us a round, 0.01% of "
                     "the target's time"]


def test_following_ablation_is_paired_with_as_built_per_repetition():
    lines = following.ablation_lines({"as built": [50.0, 40.0, 60.0],
                                      "no splicing": [45.0, 40.0, 48.0]})
    assert lines[0] == "as built            50.0 tok/s   / as built 1.00 [1.00-1.00]"
    assert lines[1] == "no splicing         45.0 tok/s   / as built 0.90 [0.80-1.00]"


def test_following_variants_change_the_engine_only_while_they_run():
    built = following_module.FOLLOW
    with following.changed(following.VARIANTS["FOLLOW 8"]):
        assert following_module.FOLLOW == 8
    assert following_module.FOLLOW == built
    with pytest.raises(RuntimeError), following.changed(following.VARIANTS["no splicing"]):
        assert following.lookup.LookupDrafter(archives=()).agreed([1, 2], 4) == ([], "context")
        raise RuntimeError
    assert following.lookup.LookupDrafter.agreed is not following.VARIANTS[
        "no splicing"][0][2]


def test_isolation_compares_geometric_means_within_a_repetition():
    tally = isolation.Tally()
    for t in isolation.TEMPERATURES:
        tally.add(t, {"in-process": [40.0, 10.0], "isolated": [36.0, 10.0]})
        tally.add(t, {"in-process": [20.0, 20.0], "isolated": [20.0, 20.0]})
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert tally.speeds["in-process T=0"] == [pytest.approx(20.0), pytest.approx(20.0)]
    assert tally.ratios(0.0) == [pytest.approx(0.9 ** 0.5), pytest.approx(1.0)]
    tally.latency = {"in-process": [10.0, 12.0, 11.0], "isolated": [13.0, 15.0, 14.0]}
    lines = tally.lines()
    assert "  T=0                    0.949 / 0.974 / 1.000" in lines
    assert lines[-1] == "one-token request, median ms: in-process 11.0, isolated 14.0 (+3.0 ms)"


def test_maskcost_figures_are_medians_per_generation():
    stats = [SimpleNamespace(mask_s=0.01, tokens=100, target_s=2.0, target_steps=100,
                             generate_s=2.5),
             SimpleNamespace(mask_s=0.03, tokens=100, target_s=3.0, target_steps=100,
                             generate_s=3.0),
             SimpleNamespace(mask_s=0.02, tokens=50, target_s=1.0, target_steps=50,
                             generate_s=1.25)]
    f = maskcost.mask_figures(stats)
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert f == {"mask_ms": pytest.approx(0.3), "step_ms": pytest.approx(20.0),
                 "share": pytest.approx(0.01)}
    assert maskcost.row("smollm2.gguf", 49152, f) == \
        "| smollm2.gguf | 49,152 | 0.300 ms | 20.00 ms | 1.5% | 1.0% |"


def sequence_report():
    runs = []
    for rep, (target_s, auto_s) in enumerate(((2.0, 1.0), (3.0, 2.0))):
        for i, pid in enumerate(("r1", "r2", "r3", "r4")):
            runs.append({"prompt": pid, "mode": "target", "rep": rep, "tokens": 50,
                         "generate_s": target_s / 2, "origin_drafted": {},
                         "origin_accepted": {}})
            runs.append({"prompt": pid, "mode": "auto", "rep": rep, "tokens": 50,
                         "generate_s": auto_s / 2,
                         "origin_drafted": {"session": 10 * i, "context": 0},
                         "origin_accepted": {"session": 5 * i, "context": 0}})
    return {"prompts": [{"id": p} for p in ("r1", "r2", "r3", "r4")], "runs": runs}


def test_sequence_counts_requests_from_the_nth_and_pairs_modes_by_repetition():
    s = sequence.Sequences.of(sequence_report(), first=3)
    assert s.modes == ["target", "auto"]
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert s.rates("target") == [50.0, pytest.approx(100 / 3)]  # 100 tokens in 2 s, in 3 s
    assert s.rates("auto") == [100.0, 50.0]
    assert s.drafted["auto"] == {"session": 100, "context": 0}  # requests 3 and 4 only
    assert s.lines() == [
        "  target       41.7 tok/s [33.3-50.0]",
        "  auto         75.0 tok/s [50.0-100.0]  lookups: session 50% of 100",
        "  auto / target: 1.75x [1.50-2.00]"]
    assert sequence.Sequences.of(sequence_report(), first=1).drafted["auto"]["session"] == 120


def test_suffixcost_documents_and_cells():
    rng = np.random.default_rng(0)
    docs = suffixcost.documents(5000, rng)
    assert sum(map(len, docs)) >= 5000
    assert all(200 <= len(d) < 800 and d.dtype == np.int32 for d in docs)
    assert all(int(d.max()) < suffixcost.VOCAB for d in docs)
    hit = suffixcost.context(docs, True, rng)
    assert len(hit) == 524 and any(
        hit[-24:] == d[i:i + 24].tolist() for d in docs for i in range(len(d) - 23))
    assert len(suffixcost.context(docs, False, rng)) == 524
    assert suffixcost.timing_cell([float(x) for x in range(1, 21)]) == "10, 19"


def rpc_report(seconds, target, auto, vs, k, acc):
    summary = {"overall": {"target": {"tokens_per_s_pooled": target},
                           "auto": {"tokens_per_s_pooled": auto, "vs_target_geomean": vs,
                                    "mean_draft_length": k, "acceptance_rate": acc}}}
    return {"calibration": {"target": {"curve": {"seconds": seconds}}}, "summary": summary}


def test_rpc_latency_reads_the_remote_targets_curve_and_autos_speedup():
    report = rpc_report([0.010, 0.012, 0.013, 0.015, 0.020], 90.0, 120.0, 1.33, 2.5, 0.8)
    row = rpc_latency.summary_row("F32", 5.0, report)
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert row["t1_ms"] == pytest.approx(10.0)
    assert row["ratios"] == {2: pytest.approx(1.2), 3: pytest.approx(1.3),
                             5: pytest.approx(2.0)}  # T(8) was not calibrated
    assert (row["auto_vs_target"], row["auto_mean_k"], row["acceptance"]) == (1.33, 2.5, 0.8)
    line = rpc_latency.table([row])[2]
    assert line == ("| F32 | 5 ms | 10.0 ms | 1.20 | 1.30 | 2.00 | nan | 90.0 | 120.0 | "
                    "1.33x | 2.50 |")


def test_rpc_latency_parses_ggml_rpc_commands_and_counts_round_trips():
    trace = rpc_latency.WireTrace()
    feed = trace.parser()
    compute = rpc_latency.RPC_COMMANDS.index("GRAPH_COMPUTE")
    get = rpc_latency.RPC_COMMANDS.index("GET_TENSOR")
    wire = struct.pack("<BQ", compute, 5) + b"12345" + struct.pack("<BQ", get, 0)
    for i in range(0, len(wire), 4):  # the stream arrives in pieces
        feed(wire[i:i + 4])
    assert [(name, size) for _, name, size in trace.take()] == [("GRAPH_COMPUTE", 5),
                                                                ("GET_TENSOR", 0)]
    assert trace.take() == []
    assert rpc_latency._runs(["A", "A", "B", "A"]) == "A x2, B, A"
    rows = {1: rpc_latency.Traced(), 2: rpc_latency.Traced()}
    for rep in range(3):
        rows[1].add(rep, 0.010 if rep else 0.050, ["GRAPH_COMPUTE", "GET_TENSOR"])
        rows[2].add(rep, 0.015, ["SET_TENSOR", "GRAPH_COMPUTE", "GET_TENSOR"])
    lines, out = rpc_latency.trace_table("m.gguf", 5.0, ["HELLO", "HELLO"], rows)
    assert lines[0] == ("\nm.gguf, 5 ms each way: 2 commands to load and decode the prompt "
                        "(HELLO x2)")
    assert lines[3] == ("| 1 | 10.0 | 1.00 | 1 | GRAPH_COMPUTE, GET_TENSOR | 50.0, 5.00, 1, "
                        "same |")
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert out[1]["ratio"] == pytest.approx(1.5) and out[1]["round_trips"] == 1


def test_promptcache_compares_medians_per_repetition_and_spreads_every_request():
    s = promptcache.Summary.of([[0.1, 0.2, 0.3], [0.2, 0.2, 0.2]],
                               [[1.0, 1.0, 4.0], [0.5, 0.5, 9.0]])
    assert (s.cached.min, s.cached.median, s.cached.max) == (0.1, 0.2, 0.3)
    assert (s.uncached.min, s.uncached.median, s.uncached.max) == (0.5, 1.0, 9.0)
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert s.speedup.min == pytest.approx(2.5) and s.speedup.max == pytest.approx(5.0)
    a, b = promptcache.system_prompt(1, 700), promptcache.system_prompt(2, 700)
    assert a != b and len(a.split()) > 700
