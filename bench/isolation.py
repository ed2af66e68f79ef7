"""What serve's engine process costs: `specllama serve` as shipped (models in an engine
process) against the same server with the models in-process
(SPECLLAMA_SERVE_IN_PROCESS=1), one pair, one run, requests interleaved.

    python -m bench.isolation [--pair smollm2] [--reps 5] [--max-tokens 128]

Per repetition: streamed chat completions of six prompts at T = 0 and T = 0.8 (the same
seed, so both servers generate the same tokens), each sent to both servers in a random
order; tokens/s is completion tokens over the request's wall time at the client. Then
one-token requests for latency. Prints min/median/max over repetitions of the
isolated/in-process ratio of geometric-mean tokens/s, and median latencies. Idle
machine only: the two servers never decode at the same time, but anything else does.
"""

from __future__ import annotations

import contextlib
import json
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

from bench.lib.common import (
    Spread,
    add_pair_options,
    add_run_options,
    geomean,
    machine,
    model_flags,
    parser,
    run,
)
from bench.lib.processes import Serve

PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short Python function that reverses a string, with a docstring.",
    "List five tips for writing clear emails.",
    "What is the difference between a list and a tuple in Python?",
    "Describe the water cycle for a ten-year-old.",
    "Give three reasons to learn a second language.",
]
KINDS = ("in-process", "isolated")
TEMPERATURES = (0.0, 0.8)


def start(kind: str, argv: list[str]) -> Serve:
    """`specllama serve`, its models in an engine process or (in-process) in its own."""
    return Serve(argv, env={"SPECLLAMA_SERVE_IN_PROCESS": "1" if kind == "in-process"
                            else None})


def chat(server: Serve, http: httpx.Client, prompt: str, temperature: float,
         max_tokens: int) -> tuple[int, float]:
    """(completion tokens, seconds) of one streamed chat completion."""
    body = {"model": server.model, "messages": [{"role": "user", "content": prompt}],
            "temperature": temperature, "seed": 7, "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    tokens = 0
    with http.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    tokens = usage["completion_tokens"]
    return tokens, time.perf_counter() - t0


@contextlib.contextmanager
def servers(argv: list[str]) -> Iterator[dict[str, Serve]]:
    started: dict[str, Serve] = {}
    try:
        for kind in KINDS:  # one at a time: loading is not what is measured
            started[kind] = start(kind, argv)
        yield started
    finally:
        for server in started.values():
            server.stop()


@dataclass
class Tally:
    """Per repetition and temperature, each kind's geometric mean of tokens/s over the
    prompts; one-token request latencies in ms."""

    speeds: dict[str, list[float]] = field(default_factory=lambda: {
        f"{k} T={t:g}": [] for k in KINDS for t in TEMPERATURES})
    latency: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})

    def add(self, temperature: float, per_kind: dict[str, list[float]]) -> None:
        for kind in KINDS:
            self.speeds[f"{kind} T={temperature:g}"].append(geomean(per_kind[kind]))

    def ratios(self, temperature: float) -> list[float]:
        """isolated / in-process, per repetition."""
        t = f"T={temperature:g}"
        return [i / p for i, p in zip(self.speeds[f"isolated {t}"],
                                      self.speeds[f"in-process {t}"])]

    def lines(self) -> list[str]:
        out = ["\ntokens/s (geometric mean of 6 prompts), min / median / max over repetitions"]
        out += [f"  {name:22} {Spread.of(xs).slashed()}" for name, xs in self.speeds.items()]
        out.append("isolated / in-process, min / median / max")
        out += [f"  T={t:<4g}                 {Spread.of(self.ratios(t)).slashed()}"
                for t in TEMPERATURES]
        med = {k: statistics.median(v) for k, v in self.latency.items()}
        out.append(f"one-token request, median ms: in-process {med['in-process']:.1f}, "
                   f"isolated {med['isolated']:.1f} "
                   f"(+{med['isolated'] - med['in-process']:.1f} ms)")
        return out


def measure(by_kind: dict[str, Serve], http: httpx.Client, reps: int, max_tokens: int,
            latency_requests: int) -> Tally:
    rng = random.Random(0)
    tally = Tally()
    for server in by_kind.values():  # warm: first requests page the weights in
        chat(server, http, PROMPTS[0], 0.0, 16)
    for rep in range(reps):
        for temperature in TEMPERATURES:
            per_kind: dict[str, list[float]] = {k: [] for k in KINDS}
            for prompt in PROMPTS:
                for kind in rng.sample(KINDS, len(KINDS)):
                    tokens, seconds = chat(by_kind[kind], http, prompt, temperature, max_tokens)
                    per_kind[kind].append(tokens / seconds)
            tally.add(temperature, per_kind)
        print(f"rep {rep + 1}: isolated/in-process "
              + ", ".join(f"T={t:g} {tally.ratios(t)[-1]:.3f}" for t in TEMPERATURES),
              flush=True)
    for _ in range(latency_requests):
        for kind in rng.sample(KINDS, len(KINDS)):
            _, seconds = chat(by_kind[kind], http, "Hi", 0.0, 1)
            tally.latency[kind].append(seconds * 1000)
    return tally


def main() -> None:
    p = parser(__doc__)
    add_pair_options(p, pair="smollm2")
    add_run_options(p, reps=5, max_tokens=128, json=True)
    p.add_argument("--latency-requests", type=int, default=30)
    args = p.parse_args()
    cpu = machine()
    print(f"cpu: {cpu}; pair {args.target or args.pair}, {args.threads} threads, "
          f"{args.reps} repetitions")
    with servers([*model_flags(args), "--threads", str(args.threads)]) as by_kind, \
            httpx.Client(timeout=600) as http:
        tally = measure(by_kind, http, args.reps, args.max_tokens, args.latency_requests)
    print("\n".join(tally.lines()))
    if args.json:
        args.json.write_text(json.dumps({
            "cpu": cpu, "pair": args.pair, "speeds": tally.speeds,
            "ratios": {str(t): tally.ratios(t) for t in TEMPERATURES},
            "latency_ms": tally.latency}, indent=1))


if __name__ == "__main__":
    run(main)
