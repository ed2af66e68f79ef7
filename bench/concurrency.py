"""Several clients at once: `specllama serve --parallel N` beside `--parallel 1` and
`llama-server -np N` (with and without its draft model), on the same pair.

Per repetition every server starts afresh (nothing drafts from an earlier repetition's
output: specllama's suffix cache and both servers' KV caches start empty), all at once
(an idle one uses no CPU), each warmed by C short requests at once, then one. Then, per
temperature, each server in turn gets C clients at once, each one streamed chat request
of --max-tokens, and one single client alone (the time to first token to compare with).
The prompts are new topics at each repetition and temperature, the same for every
server. Figures per server and temperature: aggregate tokens/s (all completion tokens
over the wall time from the first request sent to the last byte of the last answer), p95
time to first token (first streamed text) over the C clients, and the single client's;
min/median/max over repetitions, and ratios within each repetition.

    python -m bench.concurrency --pair smollm2-f32 --reps 5
    python -m bench.concurrency --clients 4 --parallel 4 --temperatures 0 --reps 3

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.lib.common import SPECLLAMA, Spread, add_pair_options, model_flags, parser
from bench.lib.common import run as run_main
from bench.lib.llamacpp_build import numbers, pair_and_tools
from bench.lib.processes import ApiServer, body

TOPICS = (
    "a lighthouse keeper", "volcanoes", "the history of paper", "a chess tournament",
    "bees", "the first bicycle", "a city under the sea", "glaciers", "a lost umbrella",
    "the printing press", "octopuses", "a desert caravan", "thunderstorms", "a robot chef",
    "the Silk Road", "coral reefs", "a time traveler's diary", "windmills", "owls",
    "a mountain rescue", "the telescope", "a night market", "penguins", "an old clock",
    "the first airplane", "a haunted library", "rainforests", "a space elevator",
    "honey", "a train across Siberia", "the compass", "a village festival", "whales",
    "a broken violin", "the Great Wall", "a snowstorm", "a robot gardener", "tea",
    "the deep ocean", "a kite contest", "the moon landing", "a secret garden",
)
TASKS = ("Write a short story about {}.", "Explain to a child what is special about {}.",
         "Give five facts about {}.", "Describe {} in vivid detail.")


@dataclass
class Contender:
    name: str
    argv: list[str]  # without the port
    # per temperature, per repetition: {"tok_s", "ttft_p95", "ttft_single", ...}
    runs: dict[float, list[dict[str, float]]] = field(default_factory=dict)


def contenders(args: argparse.Namespace, target: Path, draft: Path) -> list[Contender]:
    t, n = str(args.threads), str(args.parallel)
    ours = [*SPECLLAMA, "serve", *model_flags(args), "--threads", t,
            "--n-ctx", str(args.n_ctx), "--queue", str(args.clients)]
    lcpp = [str(args.bins["llama-server"]), "-m", str(target), "-t", t, "-tb", t,
            "--no-webui", "--host", "127.0.0.1"]
    per_slot = str(args.n_ctx * args.parallel)  # llama-server splits -c among its slots
    out = [Contender("specllama --parallel 1", [*ours, "--parallel", "1"]),
           Contender(f"specllama --parallel {n}", [*ours, "--parallel", n]),
           Contender(f"llama-server -np {n}", [*lcpp, "-c", per_slot, "-np", n])]
    if not args.no_draft_baseline:
        out.append(Contender(f"llama-server -np {n} -md", [
            *lcpp, "-c", per_slot, "-np", n, "-md", str(draft), "-td", t, "-tbd", t]))
    return out


def prompt(round_: int, client: int, n_clients: int) -> str:
    """Client `client`'s prompt (n_clients: the one alone) in round `round_`."""
    i = round_ * (n_clients + 1) + client
    return TASKS[i % len(TASKS)].format(TOPICS[i % len(TOPICS)])


def streamed(port: int, payload: dict[str, Any], t0: float, timeout: float) -> dict[str, Any]:
    """One streamed chat completion: its tokens, first text and end, from t0."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    first, tokens = None, 0
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(payload),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            sys.exit(f"port {port}: answered {resp.status}: {resp.read()[:300]!r}")
        for line in resp:
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            chunk = json.loads(line[5:])
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            if first is None and delta.get("content"):
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    finally:
        conn.close()
    return {"tokens": tokens, "ttft": first if first is not None else float("nan"),
            "end": time.perf_counter() - t0}


def burst(server: ApiServer, texts: list[str], temp: float, seed: int,
          args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every text at once, one client thread each."""
    out: list[dict[str, Any]] = [{} for _ in texts]
    t0 = time.perf_counter()

    def client(i: int) -> None:
        out[i] = streamed(server.port, body(server.model, texts[i], temp, seed + i,
                                            args.max_tokens, True), t0, args.timeout)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(texts))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return out


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


def measure(c: Contender, server: ApiServer, args: argparse.Namespace, rep: int,
            temp: float, round_: int) -> None:
    seed = args.seed + 1000 * rep
    texts = [prompt(round_, i, args.clients) for i in range(args.clients)]
    many = burst(server, texts, temp, seed, args)
    alone = burst(server, [prompt(round_, args.clients, args.clients)], temp, seed, args)[0]
    tokens = sum(r["tokens"] for r in many)
    figures = {"tok_s": tokens / max(r["end"] for r in many),
               "ttft_p95": p95([r["ttft"] for r in many]), "ttft_single": alone["ttft"],
               "single_tok_s": alone["tokens"] / alone["end"], "tokens": tokens}
    c.runs.setdefault(temp, []).append(figures)
    print(f"  rep {rep + 1} T={temp:g} {c.name}: {figures['tok_s']:.1f} tok/s, p95 TTFT "
          f"{figures['ttft_p95']:.3f} s (alone {figures['ttft_single']:.3f} s)", flush=True)


def report(cs: list[Contender], temps: list[float], args: argparse.Namespace) -> dict[str, Any]:
    """Per temperature, per server: tok/s, x --parallel 1, p95 TTFT / alone, ours / it."""
    base, ours = cs[0], cs[1]
    summary: dict[str, Any] = {}
    for temp in temps:
        print(f"\nT = {temp:g}: {args.clients} clients at once, {args.max_tokens} tokens each, "
              f"{args.reps} reps (min/median/max)")
        print(f"  {'server':28s} {'tok/s':>18s} {'x --parallel 1':>16s} "
              f"{'p95 TTFT / alone':>18s} {'ours / it':>16s}")
        rows = {}
        for c in cs:
            runs = c.runs[temp]
            row = {
                "tok_s": Spread.of([r["tok_s"] for r in runs]),
                "vs_parallel_1": Spread.of([r["tok_s"] / b["tok_s"]
                                            for r, b in zip(runs, base.runs[temp])]),
                "ttft_p95_over_single": Spread.of([r["ttft_p95"] / r["ttft_single"]
                                                   for r in runs]),
                "ours_over_it": Spread.of([o["tok_s"] / r["tok_s"]
                                           for o, r in zip(ours.runs[temp], runs)]),
            }
            print(f"  {c.name:28s} {row['tok_s'].slashed(1):>18s} "
                  f"{row['vs_parallel_1'].slashed(2):>16s} "
                  f"{row['ttft_p95_over_single'].slashed(2):>18s} "
                  f"{row['ours_over_it'].slashed(2):>16s}")
            rows[c.name] = {k: v.as_dict() for k, v in row.items()}
        summary[str(temp)] = rows
    return summary


def arguments() -> argparse.ArgumentParser:
    p = parser(__doc__)
    add_pair_options(p, threads=2)
    p.add_argument("--clients", type=int, default=4, help="clients at once (default: 4)")
    p.add_argument("--parallel", type=int, default=4,
                   help="--parallel / -np of the servers that batch (default: 4)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperatures", default="0,0.8")
    p.add_argument("--n-ctx", type=int, default=2048, help="per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--sdist", type=Path, help="local llama-cpp-python sdist (.tar.gz)")
    p.add_argument("--no-draft-baseline", action="store_true",
                   help="leave out llama-server -np N -md")
    p.add_argument("--logs", type=Path, help="servers' stderr into this folder")
    p.add_argument("--json", type=Path, help="write every figure here as JSON")
    return p


def main() -> None:
    args = arguments().parse_args()
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    version, target, draft, args.bins = pair_and_tools(args)
    assert draft is not None  # (no --mtp here: a draft model)
    temps = numbers(args.temperatures)
    cs = contenders(args, target, draft)
    for rep in range(args.reps):
        servers: dict[str, ApiServer] = {}
        try:
            for c in cs:
                servers[c.name] = server = ApiServer(c.name, c.argv, "--port", args.timeout,
                                                     args.logs)
                # warmed as it is measured, C at once (the batch shapes of a burst,
                # built once, are not what a time to first token should include)
                warm = argparse.Namespace(max_tokens=16, timeout=args.timeout)
                burst(server, [f"Say hello to {n}." for n in range(args.clients)], 0.0, 0, warm)
                burst(server, ["Say hello."], 0.0, 0, warm)
            for t, temp in enumerate(temps):
                for c in cs:  # interleaved: a busy spell hits every server alike
                    measure(c, servers[c.name], args, rep, temp, rep * len(temps) + t)
        finally:
            for server in servers.values():
                server.stop()
    print(f"\ntarget {target}\ndraft {draft}\nthreads {args.threads}, llama-cpp-python "
          f"{version}")
    summary = report(cs, temps, args)
    if args.json:
        args.json.write_text(json.dumps({
            "llama_cpp_python": version, "target": str(target), "draft": str(draft),
            "args": {k: v for k, v in vars(args).items() if k != "bins"},
            "summary": summary,
            "runs": {c.name: {str(t): r for t, r in c.runs.items()} for c in cs},
        }, indent=1, default=str))


if __name__ == "__main__":
    run_main(main)
