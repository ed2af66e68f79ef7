"""bench/soak.py: the request mix, when faults strike, how a stream's end is judged and
the summary of a made-up run, without servers; and a small soak of serve --rpc on the
tiny models, with the RPC server and the engine process killed."""

import json
import tempfile
from collections import Counter
from pathlib import Path

import httpx

from bench import soak
from bench.lib.soak_report import summarize, summary_lines
from bench.lib.soak_requests import KINDS, WORDS, Outcome, Run, Spec, body, plan, read_stream


def test_the_request_mix_is_reproducible_and_varied():
    specs = plan(600, seed=3)
    assert specs == plan(600, seed=3) and specs != plan(600, seed=4)
    assert [s.index for s in specs] == list(range(600))
    assert all(s.drop_after == 0 for s in specs if not s.stream)  # only streams are dropped
    dropped = [s for s in specs if s.drop_after > 0]
    assert 0.18 < len(dropped) / sum(s.stream for s in specs) < 0.32  # a quarter of them
    # at a random point, not only after the first chunk or two
    assert max(s.drop_after for s in dropped) > 10
    assert all(1 <= s.drop_after <= max(2, s.max_tokens // 3) for s in dropped)
    assert not any(s.drop_after for s in plan(600, seed=3, abandon=0.0))
    everything = plan(600, seed=3, abandon=1.0)
    assert all(s.drop_after > 0 for s in everything if s.stream)
    assert 0.55 < sum(s.chat for s in specs) / 600 < 0.8
    assert {s.temperature for s in specs} == {0.0, 0.8}
    assert {s.max_tokens for s in specs} == {4, 8, 16, 32, 48, 64}
    words = [len(s.prompt.split()) for s in specs]
    assert min(words) >= 5 and max(words) < 300
    assert set(specs[0].prompt.split()) <= set(WORDS)
    chat = body(Spec(7, True, False, 0, 0.8, 16, "hi there"), "m")
    assert chat == {"model": "m", "max_tokens": 16, "temperature": 0.8, "seed": 7,
                    "stream": False, "messages": [{"role": "user", "content": "hi there"}]}
    assert "prompt" in body(Spec(7, False, True, 0, 0.0, 16, "hi"), "m")


def test_faults_strike_at_even_steps_with_the_hangs_among_the_kills():
    assert soak.fault_schedule(4, 1, 1000) == [(166, "kill"), (333, "kill"), (500, "hang"),
                                               (666, "kill"), (833, "kill")]
    assert soak.fault_schedule(0, 0, 1000) == []
    assert [k for _, k in soak.fault_schedule(2, 2, 100)] == ["kill", "hang", "hang", "kill"]
    # the soak: the engine kills among the RPC server's faults, never together
    assert soak.fault_schedule(2, 1, 1000, engine_kills=2) == [
        (166, "kill"), (333, "engine"), (500, "hang"), (666, "engine"), (833, "kill")]
    assert soak.fault_schedule(0, 0, 30, engine_kills=1) == [(15, "engine")]


def stream(*chunks: object, done: bool = True) -> httpx.Response:
    lines = [f"data: {json.dumps(c)}\n\n" for c in chunks] + (["data: [DONE]\n\n"] if done
                                                              else [])
    return httpx.Response(200, content="".join(lines).encode())


def judged(r: httpx.Response, drop_after: int = 0) -> tuple[str, str, float | None]:
    spec = Spec(0, True, True, drop_after, 0.0, 8, "hi")
    out = Outcome(0, "lost", 200, "", True, 0.0, 0.0)
    kind, detail = read_stream(r, spec, out, 0.0)
    return kind, detail, out.first_token_s


def test_a_stream_is_complete_only_with_a_finish_reason_and_done():
    text = {"choices": [{"delta": {"content": "Hi"}, "finish_reason": None}]}
    end = {"choices": [{"delta": {}, "finish_reason": "stop"}]}
    kind, _, first = judged(stream(text, end))
    assert kind == "completed" and first is not None
    assert judged(stream(text))[:2] == ("lost", "[DONE] without finish_reason")
    assert judged(stream(text, end, done=False))[0] == "lost"  # cut short
    assert judged(stream(text, {"error": {"code": "engine_restarted"}}))[:2] == \
        ("error event", "engine_restarted")
    assert judged(stream(text, end), drop_after=1)[:2] == ("dropped", "after 1 chunk(s)")


def made_up_run() -> Run:
    specs = plan(6, seed=0)
    run = Run(specs, serve=None, deadline=0.0)  # type: ignore[arg-type]
    run.issued, run.ended_s = 6, 12.34
    for i, (kind, seconds) in enumerate([("completed", 1.0), ("completed", 3.0),
                                         ("completed", 2.0), ("503", 0.1), ("dropped", 0.5),
                                         ("lost", 9.0)]):
        run.outcomes.append(Outcome(i, kind, 200, "engine_down" if kind == "503" else "",
                                    specs[i].stream, float(i), seconds))
    run.samples = [{"t": 0.0, "engine_pid": 11, "serve_kib": 102400, "engine_kib": 204800,
                    "cache_bytes": 0, "cache_limit": 64 << 20},
                   {"t": 2.0, "engine_pid": 12, "serve_kib": 153600, "engine_kib": 0,
                    "error": "ReadTimeout"},
                   {"t": 4.0, "engine_pid": 12, "serve_kib": 122880, "engine_kib": 225280,
                    "cache_bytes": 5 << 20, "cache_limit": 64 << 20}]
    run.faults = [{"kind": "kill", "at_s": 5.0, "at_request": 3, "first_503_after_s": 0.5,
                   "serving_again_after_back_s": 4.0}]
    return run


def test_the_summary_counts_every_outcome_and_keeps_the_lost_ones():
    final = {"final_health_status": 200, "final_requests": {"served": 5},
             "final_engine_pid": 12, "clients_hung": 0, "serve_exit": 0,
             "engine_left": False, "tracebacks": 0, "final_busy": False, "final_serving": 0,
             "final_waiting": 0, "settled_after_s": 0.5,
             "final_prompt_cache": {"entries": 3, "bytes": 3 << 20, "limit_bytes": 64 << 20,
                                    "hits": 2}}
    s = summarize(made_up_run(), final, rss_growth_mib=10)
    assert s["outcomes"] == {**dict.fromkeys(KINDS, 0), "completed": 3, "503": 1,
                             "dropped": 1, "lost": 1}
    assert Counter(s["details"]) == {"503: engine_down": 1, "lost: ": 1}
    assert [o["index"] for o in s["lost"]] == [5]
    assert s["latency_s"]["all"] == {"n": 3, "p50": 2.0, "p95": 3.0}
    assert s["rss_mib"] == {
        "serve": {"start": 100.0, "max": 150.0, "end": 120.0, "warm": 100.0, "last": 120.0,
                  "growth": 20.0, "bounded": False, "less_cache": False},
        # the engine's growth is judged without its prompt cache's 5 MiB of copies
        "engine": {"start": 200.0, "max": 220.0, "end": 220.0, "warm": 200.0, "last": 215.0,
                   "growth": 15.0, "bounded": False, "less_cache": True}}
    assert s["requests_lost"] == 1
    assert s["prompt_cache"] == {"readings": 3, "max_bytes": 5 << 20, "limit_bytes": 64 << 20,
                                 "over_limit": 0, "within_limit": True}
    assert s["checks"] == {"none_lost": False, "rss_bounded": False,
                           "cache_within_limit": True, "idle_at_end": True}
    assert s["engine_pids"] == [11, 12] and len(s["health_errors"]) == 1
    text = "\n".join(summary_lines(s))
    assert "6 of 6 requests sent, 6 answered, in 12 s" in text
    assert "lost              1   <- must be 0" in text
    assert "     5 (   3) kill      0.5    4.0" in text
    assert "prompt cache at the end: 3 copies, 3 of 64 MiB, 2 hits" in text
    assert "prompt cache at most 5.0 of 64 MiB over 3 readings; over its limit: 0" in text
    assert "busy False, serving 0, waiting 0" in text
    assert "checks: none_lost FAILED, rss_bounded FAILED" in text
    # a request sent and never answered is lost too; a cache over its limit fails
    run = made_up_run()
    run.issued = 7
    run.specs = plan(7, seed=0)
    run.samples[2]["cache_bytes"] = 65 << 20
    s = summarize(run, {**final, "final_busy": True, "final_serving": 1})
    assert s["requests_lost"] == 2 and s["rss_mib"]["serve"]["bounded"]  # 20 <= 64 MiB
    assert s["checks"] == {"none_lost": False, "rss_bounded": True,
                           "cache_within_limit": False, "idle_at_end": False}


def test_a_small_soak_with_the_rpc_server_and_the_engine_killed(tiny_target, tiny_draft):
    """The issue's options on a few requests: --parallel 2, every stream abandoned at a
    random point, the engine process killed with requests in flight (the RPC server's
    kills are the older tests' and the real soak's); none lost, serve idle at the end."""
    args = soak.arguments().parse_args(
        ["--target", str(tiny_target), "--draft", str(tiny_draft), "--threads", "1",
         "--requests", "24", "--clients", "4", "--parallel", "2", "--abandon", "1",
         "--engine-kills", "1", "--faults", "0", "--hangs", "0",
         "--sample-s", "0.5", "--max-minutes", "3", "--start-timeout", "120", "--seed", "1"])
    serve_argv = ["--target", str(tiny_target), "--draft", str(tiny_draft), "--threads", "1",
                  "--parallel", str(args.parallel), "--n-ctx", "1024"]
    with tempfile.TemporaryDirectory(prefix="soak-test-") as tmp:
        s = soak.soak(args, serve_argv, Path(tmp))
    assert s["sent"] == s["answered"] == 24
    assert s["requests_lost"] == 0 and s["outcomes"]["lost"] == 0, s["details"]
    assert s["outcomes"]["dropped"] > 0
    assert [f["kind"] for f in s["faults"]] == ["engine"]
    engine = s["faults"][0]
    assert engine["serving_at_kill"] > 0
    assert "error" not in engine and engine["serving_again_after_back_s"] is not None
    assert engine["new_engine_pid"] != engine["engine_pid"]
    assert len(s["engine_pids"]) >= 2
    assert s["checks"]["cache_within_limit"] and s["checks"]["idle_at_end"]
    assert s["final_busy"] is False and s["final_serving"] == 0
    assert s["rss_mib"]["serve"] and s["rss_mib"]["engine"]
    assert s["clients_hung"] == 0 and not s["engine_left"]

