"""Time to first token of `specllama serve` with its prompt cache and without, on requests
that take turns between long system prompts (agents, several conversations at once).

Two servers of the same pair run side by side (idle but for the request being served):
one with `--cache-mib`, one with `--cache-mib 0`. Each repetition sends, to each server in
turn, the same sequence: system prompt A, then B, then A, B, ... with a new question each
time, streamed; the time to the first text is measured from sending. The first request
for each system prompt is cold on both and left out. Without the cache, the live KV
caches (the last request's) still serve a prompt that repeats the one before it: here no
two consecutive requests share their system prompt.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.lib.common import Spread, add_pair_options, machine, model_flags, parser, run
from bench.lib.processes import Serve

WORDS = ("the river city council market morning garden library evening station winter "
         "harbour bridge teacher student letter window summer mountain village kitchen "
         "doctor painter museum festival forest engine").split()


def system_prompt(seed: int, words: int) -> str:
    """A long system prompt of plain sentences, different for each seed."""
    out = []
    for i in range(words // 8):
        pick = [WORDS[(seed * 7 + i * (3 + seed) + j * 5) % len(WORDS)] for j in range(6)]
        out.append(f"Rule {i + 1}: the {pick[0]} and the {pick[1]} near the {pick[2]} "
                   f"keep the {pick[3]} {pick[4]} {pick[5]}.")
    return "You follow these rules.\n" + "\n".join(out)


def first_text_s(url: str, model: str, system: str, question: str,
                 max_tokens: int) -> tuple[float, int]:
    """Seconds from sending to the first text of the streamed answer; prompt tokens."""
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}]}
    first, prompt_tokens = None, 0
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
            if first is None and delta.get("content"):
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"]["prompt_tokens"]
    return (first if first is not None else time.perf_counter() - t0), prompt_tokens


@dataclass(frozen=True)
class Summary:
    cached: Spread
    uncached: Spread
    speedup: Spread  # per repetition: the median without over the median with

    @classmethod
    def of(cls, cached: list[list[float]], uncached: list[list[float]]) -> Summary:
        """`cached[rep]`: the warm requests' times of one repetition."""
        flat = lambda xs: [x for rep in xs for x in rep]  # noqa: E731
        ratios = [Spread.of(u).median / Spread.of(c).median for c, u in zip(cached, uncached)]
        return cls(Spread.of(flat(cached)), Spread.of(flat(uncached)), Spread.of(ratios))


def main() -> None:
    p = parser(__doc__)
    add_pair_options(p)
    p.add_argument("--reps", type=int, default=5, help="repetitions (default: %(default)s)")
    p.add_argument("--turns", type=int, default=6,
                   help="requests per repetition, taking turns between 2 system prompts")
    p.add_argument("--words", type=int, default=400,
                   help="words per system prompt (about 1,000 tokens; default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--cache-mib", type=int, default=1024)
    args = p.parse_args()
    flags = [*model_flags(args), "--threads", str(args.threads), "--n-ctx", "4096"]
    servers = {"with": Serve([*flags, "--cache-mib", str(args.cache_mib)]),
               "without": Serve([*flags, "--cache-mib", "0"])}
    times: dict[str, list[list[float]]] = {"with": [], "without": []}
    tokens = 0
    try:
        for rep in range(args.reps):
            # New system prompts each repetition: a repetition never reuses another's.
            systems = [system_prompt(100 * rep + k, args.words) for k in (1, 2)]
            for name, s in servers.items():
                warm: list[float] = []
                for turn in range(args.turns):
                    seconds, tokens = first_text_s(s.url, s.model, systems[turn % 2],
                                                   f"Question {turn}: what about the river?",
                                                   args.max_tokens)
                    if turn >= 2:
                        warm.append(seconds)
                times[name].append(warm)
                print(f"rep {rep + 1} {name} cache: " + " ".join(f"{t:.3f}" for t in warm),
                      flush=True)
        health: dict[str, Any] = servers["with"].health()[1]
    finally:
        for s in servers.values():
            s.stop()
    summary = Summary.of(times["with"], times["without"])
    print(f"\n{machine()}; {args.threads} threads; prompts of {tokens} tokens; "
          f"{args.reps} reps x {args.turns - 2} warm requests")
    print(f"time to first token with the cache:    {summary.cached.slashed()} s "
          "(min / median / max)")
    print(f"time to first token without the cache: {summary.uncached.slashed()} s")
    print(f"without / with, per repetition:        {summary.speedup.slashed(2)}")
    print(f"prompt cache: {health['prompt_cache']}")


if __name__ == "__main__":
    run(main)
