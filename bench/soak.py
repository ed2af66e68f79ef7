"""A soak of `specllama serve` whose target lives on a `specllama rpc-server` that fails.

Starts `specllama rpc-server` and `specllama serve --rpc` on it (loopback, free ports,
SPECLLAMA_RPC_TIMEOUT=`--rpc-timeout` in serve's environment: one batched compute of
--parallel long prompts must fit in it, more than 3 s on a 2-core machine), then sends
`--requests` requests from `--clients` threads (httpx) to serve's `--parallel` slots, so
requests queue: chat and plain completions, prompts of 5-300 words, max_tokens 4-64,
streamed or not, greedy or T = 0.8; a share `--abandon` of the streams is abandoned by
its client at a random point (after 1 to max_tokens / 3 data lines). A client that gets
a 503 waits what its Retry-After says (10 s at most) before its next request. Meanwhile,
evenly over the run and one at a time: the RPC server is killed (SIGKILL) `--faults`
times and stopped (SIGSTOP, longer than the RPC timeout) `--hangs` times, and started
again on the same port after `--down` seconds; and the engine process (engine_pid from
/health) is killed (SIGKILL) `--engine-kills` times with requests in flight (/health's
`serving` > 0).

Every request must end with an HTTP status, a stream with `data: [DONE]`; anything else
(an exception, a reset, a timeout, a stream cut short, a request sent and never
answered) is LOST, and there must be none. The RSS of serve and of its engine process
(a new one after each restart), /health's `busy`, `serving` and prompt cache figures
are sampled every `--sample-s` seconds. The report checks: none lost; the RSS bounded
(the median of the last tenth of the samples at most `--rss-growth-mib` over that of
the tenth after the first fifth, the warm-up); the prompt cache's bytes within its limit
at every sample; and, once the run settles, /health 200 with `busy` false and `serving`
0 (within 60 s). It exits 1 when a check fails.

    python -m bench.soak                                  # 1,000 requests, default pair
    python -m bench.soak --requests 60 --faults 2 --max-minutes 5
    python -m bench.soak --requests 1000 --clients 8 --parallel 4 --abandon 0.25 \
        --engine-kills 2 --faults 2 --hangs 1 --max-minutes 15     # issue #52's soak
    python -m bench.soak --target t.gguf --draft d.gguf --clients 6 --json soak.json

Every process it starts is killed at the end, whatever happens. Models resolve through
the user's cache as for any specllama command; nothing else is written outside a
temporary folder (serve's and the RPC server's logs, kept with `--logs DIR`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.lib.common import add_pair_options, machine, model_flags, parser, run
from bench.lib.processes import RpcServer, Serve
from bench.lib.soak_report import summarize, summary_lines
from bench.lib.soak_requests import Run, client, plan

RPC_TIMEOUT_S = 10


# ------------------------------------------------------------------------ processes


def rss_kib(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(found.group(1)) if found else None


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


# ---------------------------------------------------------------- faults, samples


def spread_among(n: int, m: int) -> list[int]:
    """m of the positions 0..n-1, evenly."""
    return sorted({round((k + 1) * (n + 1) / (m + 1)) - 1 for k in range(m)})


def fault_schedule(kills: int, hangs: int, requests: int,
                   engine_kills: int = 0) -> list[tuple[int, str]]:
    """(requests sent, "kill", "hang" or "engine") for each fault: at even steps of the
    run, the engine kills spread among the RPC server's faults, the hangs among the
    rest."""
    n = kills + hangs + engine_kills
    engine_at = set(spread_among(n, engine_kills))
    rest = [k for k in range(n) if k not in engine_at]
    hang_at = {rest[i] for i in spread_among(len(rest), hangs)}
    return [((k + 1) * requests // (n + 1),
             "engine" if k in engine_at else "hang" if k in hang_at else "kill")
            for k in range(n)]


def faults(run: Run, rpc: RpcServer, args: argparse.Namespace) -> None:
    for threshold, kind in fault_schedule(args.faults, args.hangs, len(run.specs),
                                          args.engine_kills):
        while run.issued < threshold and not run.done.is_set():
            run.done.wait(0.2)
        if run.done.is_set():
            return
        if kind == "engine":
            engine_kill(run)
        else:
            fault(run, rpc, kind, args)


def engine_kill(run: Run, wait_in_flight: float = 30) -> None:
    """The engine process killed (SIGKILL) once /health says requests are being served
    (within `wait_in_flight` s); then until /health says serving again, with a new one."""
    at = run.now()
    pid, in_flight = None, 0
    while run.now() - at < wait_in_flight and not run.done.is_set():
        h = health(run.serve)
        pid, in_flight = (h or {}).get("engine_pid"), (h or {}).get("serving") or 0
        if pid and in_flight:
            break
        time.sleep(0.1)
    record: dict[str, Any] = {"kind": "engine", "at_s": round(run.now(), 1),
                              "at_request": run.issued, "engine_pid": pid,
                              "serving_at_kill": in_flight, "first_503_after_s": None,
                              "serving_again_after_back_s": None}
    if not pid:
        record["error"] = "no engine_pid in /health"
        run.faults.append(record)
        return
    print(f"  {run.now():6.0f} s: engine process {pid} killed with {in_flight} request(s) "
          "in flight", file=sys.stderr)
    killed = run.now()
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
    # Killed with requests in flight, the server restarts it whether or not more come:
    # wait for that past the run's end (on a busy machine the last 503s come first).
    # Killed idle, only traffic would notice: stop with the run.
    while run.now() - killed < 180 and not (run.done.is_set() and not in_flight):
        status, h = health_and_status(run.serve)
        if status == 503 and record["first_503_after_s"] is None:
            record["first_503_after_s"] = round(run.now() - killed, 1)
        if status == 200 and h.get("engine_pid") not in (None, pid):
            record.update(serving_again_after_back_s=round(run.now() - killed, 1),
                          new_engine_pid=h.get("engine_pid"))
            break
        time.sleep(0.25)
    run.faults.append(record)


def fault(run: Run, rpc: RpcServer, kind: str, args: argparse.Namespace) -> None:
    """One fault: the RPC server killed (after --hang-s stopped, for a hang), down for
    --down s, started again on its port; then until /health says serving again."""
    at = run.now()
    record: dict[str, Any] = {"kind": kind, "at_s": round(at, 1), "at_request": run.issued}
    print(f"  {at:6.0f} s: RPC server {'stopped' if kind == 'hang' else 'killed'}",
          file=sys.stderr)
    rpc.signal(signal.SIGSTOP if kind == "hang" else signal.SIGKILL)
    first_503 = watch_health(run, args.hang_s if kind == "hang" else 0)
    rpc.kill()
    first_503 = watch_health(run, args.down) if first_503 is None else first_503
    time.sleep(max(0.0, at + args.hang_s * (kind == "hang") + args.down - run.now()))
    try:
        rpc.start()
    except RuntimeError as exc:
        record["error"] = str(exc)
        print(f"  {exc}", file=sys.stderr)
    back, serving = run.now(), None
    while serving is None and run.now() - back < 120:  # (no traffic left: it may not know)
        status = health_status(run.serve)
        if status == 503 and first_503 is None:
            first_503 = run.now()
        if status == 200 and (first_503 is not None or run.done.is_set()):
            serving = run.now()
        time.sleep(0.5)
    record.update(rpc_back_s=round(back, 1),
                  first_503_after_s=None if first_503 is None else round(first_503 - at, 1),
                  serving_again_after_back_s=None if serving is None else round(serving - back, 1))
    run.faults.append(record)


def watch_health(run: Run, seconds: float) -> float | None:
    """Poll /health for `seconds`; when it first answered 503, if it did."""
    first, end = None, time.monotonic() + seconds
    while time.monotonic() < end:
        if first is None and health_status(run.serve) == 503:
            first = run.now()
        time.sleep(0.5)
    return first


def health_status(serve: Serve) -> int | None:
    return health_and_status(serve)[0]


def health_and_status(serve: Serve) -> tuple[int | None, dict[str, Any]]:
    try:
        return serve.health(timeout=5)
    except (httpx.HTTPError, ValueError):
        return None, {}


def health(serve: Serve) -> dict[str, Any] | None:
    status, h = health_and_status(serve)
    return h if status is not None else None


def sample(run: Run) -> None:
    """/health's status and engine_pid, and the RSS of serve and of that engine."""
    s: dict[str, Any] = {"t": round(run.now(), 1), "health": None, "engine_pid": None}
    try:
        s["health"], h = run.serve.health(timeout=5)
        s["engine_pid"] = h.get("engine_pid")
        s["busy"], s["serving"] = h.get("busy"), h.get("serving")
        cache = h.get("prompt_cache") or {}
        s["cache_bytes"], s["cache_limit"] = cache.get("bytes"), cache.get("limit_bytes")
    except (httpx.HTTPError, ValueError) as exc:
        s["error"] = f"{type(exc).__name__}: {exc}"
    s["serve_kib"] = rss_kib(run.serve.proc.pid)
    s["engine_kib"] = rss_kib(s["engine_pid"])
    run.samples.append(s)


def sampler(run: Run, every: float, stop: threading.Event) -> None:
    while not stop.wait(every):
        sample(run)


# ------------------------------------------------------------------------------ run


def final_state(run: Run, timeout: float = 60) -> dict[str, Any]:
    """After the last request: /health serving again and idle (`busy` false, `serving`
    0, none waiting) within `timeout`; its totals."""
    status: int | None = None
    h: dict[str, Any] = {}
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        status, h = health_and_status(run.serve)
        if status == 200 and h.get("busy") is False and not h.get("serving") \
                and not h.get("waiting"):
            break
        time.sleep(0.5)
    return {"final_health_status": status, "final_requests": h.get("requests"),
            "final_engine_pid": h.get("engine_pid"), "final_prompt_cache": h.get("prompt_cache"),
            "final_busy": h.get("busy"), "final_serving": h.get("serving"),
            "final_waiting": h.get("waiting"),
            "settled_after_s": round(time.monotonic() - t0, 1)}


def drive(run: Run, rpc: RpcServer, args: argparse.Namespace) -> dict[str, Any]:
    """The clients, the faults and the sampler until the last request; then the end."""
    sample(run)
    stop_sampling = threading.Event()
    helpers = [threading.Thread(target=sampler, args=(run, args.sample_s, stop_sampling),
                                daemon=True),
               threading.Thread(target=faults, args=(run, rpc, args), daemon=True)]
    clients = [threading.Thread(target=client, args=(run,), daemon=True)
               for _ in range(args.clients)]
    for t in helpers + clients:
        t.start()
    for t in clients:  # each request is bounded by its timeouts
        t.join(max(1, run.deadline - time.monotonic()) + 300)
    hung = sum(t.is_alive() for t in clients)
    run.ended_s = run.now()
    run.done.set()
    helpers[1].join(180)  # a fault under way ends with the server serving again
    final = final_state(run)
    stop_sampling.set()
    helpers[0].join(10)
    sample(run)
    engine = final["final_engine_pid"]
    final.update(clients_hung=hung, serve_exit=run.serve.stop(),
                 engine_left=bool(engine and not gone_within(engine, 10)),
                 tracebacks=sum("Traceback" in line for line in run.serve.lines))
    return summarize(run, final, rss_growth_mib=args.rss_growth_mib)


def soak(args: argparse.Namespace, serve_argv: list[str], tmp: Path) -> dict[str, Any]:
    if args.hang_s is None:
        args.hang_s = args.rpc_timeout + 5
    rpc = RpcServer(args.threads, tmp / "rpc-server.log")
    serve: Serve | None = None
    try:
        rpc.start()
        serve = Serve([*serve_argv, "--rpc", f"127.0.0.1:{rpc.port}"],
                      env={"SPECLLAMA_RPC_TIMEOUT": f"{args.rpc_timeout:g}",
                           "SPECLLAMA_API_KEY": None},
                      log=tmp / "serve.log", timeout=args.start_timeout)
        print(f"serving {serve.model} at {serve.url}, RPC server on port {rpc.port}; "
              f"logs in {tmp}", file=sys.stderr)
        return drive(Run(plan(args.requests, args.seed, args.abandon), serve,
                         deadline=time.monotonic() + 60 * args.max_minutes), rpc, args)
    finally:
        if serve is not None and serve.proc.poll() is None:
            serve.proc.kill()
            serve.proc.wait(10)
        rpc.close()


def arguments() -> argparse.ArgumentParser:
    p = parser(__doc__)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--clients", type=int, default=4, help="concurrent clients")
    p.add_argument("--parallel", type=int, default=4,
                   help="serve's --parallel: requests served at once")
    p.add_argument("--abandon", type=float, default=0.25,
                   help="the share of streams abandoned by their client at a random point")
    p.add_argument("--engine-kills", type=int, default=2,
                   help="times the engine process is killed (SIGKILL) with requests in "
                        "flight")
    p.add_argument("--faults", type=int, default=4, help="times the RPC server is killed")
    p.add_argument("--hangs", type=int, default=1,
                   help="times it is stopped (SIGSTOP) for --hang-s, then killed")
    p.add_argument("--down", type=float, default=3, help="seconds it stays down")
    p.add_argument("--rpc-timeout", type=float, default=RPC_TIMEOUT_S,
                   help="SPECLLAMA_RPC_TIMEOUT for serve (default: %(default)s s)")
    p.add_argument("--hang-s", type=float, help="seconds it stays stopped (default: "
                   "--rpc-timeout + 5)")
    p.add_argument("--max-minutes", type=float, default=30,
                   help="stop sending after this long and report")
    add_pair_options(p, pair="smollm2")  # --threads: for serve and the RPC server
    p.add_argument("--serve-args", default="", help="more flags for specllama serve")
    p.add_argument("--sample-s", type=float, default=2, help="seconds between RSS samples")
    p.add_argument("--rss-growth-mib", type=float, default=64,
                   help="RSS growth after the warm-up that still counts as bounded")
    p.add_argument("--start-timeout", type=float, default=300)
    p.add_argument("--seed", type=int, default=0, help="of the request mix")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--logs", type=Path, help="keep serve's and the RPC server's logs here")
    return p


def main() -> None:
    p = arguments()
    args = p.parse_args()
    if bool(args.target) != bool(args.draft):
        p.error("--target and --draft go together")
    if not 0 <= args.abandon <= 1:
        p.error("--abandon is a share: 0 to 1")
    serve_argv = [*model_flags(args), "--threads", str(args.threads),
                  "--parallel", str(args.parallel), *shlex.split(args.serve_args)]
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    cpu = machine()
    print(f"command: {command}\ncpu: {cpu}\nserve: {shlex.join(serve_argv)} --rpc "
          f"127.0.0.1:PORT (SPECLLAMA_RPC_TIMEOUT={args.rpc_timeout:g})")
    # a kill of this script still stops serve and the RPC server (the finally in soak)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="specllama-soak-") as tmp:
        summary = soak(args, serve_argv, args.logs or Path(tmp))
    summary.update(command=command, cpu=cpu, args=vars(args))
    print("\n".join(summary_lines(summary)))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1, default=str))
    sys.exit(0 if all(summary["checks"].values()) else 1)


if __name__ == "__main__":
    run(main)
