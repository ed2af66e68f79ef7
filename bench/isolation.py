"""What serve's engine process costs: `specllama serve` as shipped (models in an engine
process) against the same server with the models in-process
(SPECLLAMA_SERVE_IN_PROCESS=1), one pair, one run, requests interleaved.

    python bench/isolation.py [--pair smollm2] [--reps 5] [--max-tokens 128]

Per repetition: streamed chat completions of six prompts at T = 0 and T = 0.8 (the same
seed, so both servers generate the same tokens), each sent to both servers in a random
order; tokens/s is completion tokens over the request's wall time at the client. Then
one-token requests for latency. Prints min/median/max over repetitions of the
isolated/in-process ratio of geometric-mean tokens/s, and median latencies. Idle
machine only: the two servers never decode at the same time, but anything else does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

SPECLLAMA = shutil.which("specllama") or str(Path(sys.executable).with_name("specllama"))
READY = re.compile(r"serving (\S+) at (http://\S+)/v1")
PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short Python function that reverses a string, with a docstring.",
    "List five tips for writing clear emails.",
    "What is the difference between a list and a tuple in Python?",
    "Describe the water cycle for a ten-year-old.",
    "Give three reasons to learn a second language.",
]
KINDS = ("in-process", "isolated")


class Server:
    """`specllama serve` on a free port; `kind` chooses where the models run."""

    def __init__(self, kind: str, args: list[str]) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "NO_COLOR": "1"}
        env.pop("SPECLLAMA_SERVE_IN_PROCESS", None)
        if kind == "in-process":
            env["SPECLLAMA_SERVE_IN_PROCESS"] = "1"
        self.proc = subprocess.Popen([SPECLLAMA, "serve", "--port", str(port), *args],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.url = self.model = ""
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                if found := READY.search(line):
                    self.model, self.url = found.groups()
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        ready.wait(600)
        if not self.url:
            self.stop()
            raise SystemExit(f"{kind} server did not start")

    def chat(self, http: httpx.Client, prompt: str, temperature: float,
             max_tokens: int) -> tuple[int, float]:
        """(completion tokens, seconds) of one streamed chat completion."""
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "temperature": temperature, "seed": 7, "max_tokens": max_tokens,
                "stream": True, "stream_options": {"include_usage": True}}
        t0 = time.perf_counter()
        tokens = 0
        with http.stream("POST", f"{self.url}/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    usage = json.loads(line[6:]).get("usage")
                    if usage:
                        tokens = usage["completion_tokens"]
        return tokens, time.perf_counter() - t0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@contextlib.contextmanager
def servers(args: list[str]) -> Iterator[dict[str, Server]]:
    started: dict[str, Server] = {}
    try:
        for kind in KINDS:  # one at a time: loading is not what is measured
            started[kind] = Server(kind, args)
        yield started
    finally:
        for server in started.values():
            server.stop()


def geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def spread(xs: list[float]) -> str:
    return f"{min(xs):.3f} / {statistics.median(xs):.3f} / {max(xs):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--latency-requests", type=int, default=30)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    print(f"cpu: {cpu}; pair {args.pair}, {args.threads} threads, {args.reps} repetitions")
    rng = random.Random(0)
    ratios: dict[float, list[float]] = {0.0: [], 0.8: []}
    speeds: dict[str, list[float]] = {f"{k} T={t:g}": [] for k in KINDS for t in ratios}
    latency: dict[str, list[float]] = {k: [] for k in KINDS}
    with servers(["--pair", args.pair, "--threads", str(args.threads)]) as by_kind, \
            httpx.Client(timeout=600) as http:
        for server in by_kind.values():  # warm: first requests page the weights in
            server.chat(http, PROMPTS[0], 0.0, 16)
        for rep in range(args.reps):
            for temperature in ratios:
                per_kind: dict[str, list[float]] = {k: [] for k in KINDS}
                for prompt in PROMPTS:
                    for kind in rng.sample(KINDS, len(KINDS)):
                        tokens, seconds = by_kind[kind].chat(http, prompt, temperature,
                                                             args.max_tokens)
                        per_kind[kind].append(tokens / seconds)
                for kind in KINDS:
                    speeds[f"{kind} T={temperature:g}"].append(geomean(per_kind[kind]))
                ratios[temperature].append(geomean(per_kind["isolated"])
                                           / geomean(per_kind["in-process"]))
            print(f"rep {rep + 1}: isolated/in-process "
                  + ", ".join(f"T={t:g} {r[-1]:.3f}" for t, r in ratios.items()), flush=True)
        for _ in range(args.latency_requests):
            for kind in rng.sample(KINDS, len(KINDS)):
                _, seconds = by_kind[kind].chat(http, "Hi", 0.0, 1)
                latency[kind].append(seconds * 1000)
    print("\ntokens/s (geometric mean of 6 prompts), min / median / max over repetitions")
    for name, xs in speeds.items():
        print(f"  {name:22} {spread(xs)}")
    print("isolated / in-process, min / median / max")
    for t, xs in ratios.items():
        print(f"  T={t:<4g}                 {spread(xs)}")
    med = {k: statistics.median(v) for k, v in latency.items()}
    print(f"one-token request, median ms: in-process {med['in-process']:.1f}, isolated "
          f"{med['isolated']:.1f} (+{med['isolated'] - med['in-process']:.1f} ms)")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu, "pair": args.pair, "speeds": speeds,
                                         "ratios": {str(t): r for t, r in ratios.items()},
                                         "latency_ms": latency}, indent=1))


if __name__ == "__main__":
    main()
