"""`POST /infill` as llama.vim sends it, keystroke after keystroke over one file:
`specllama serve` beside `llama-server` on the same FIM model, time to first token and
tokens a second.

The editor types one line of a 150-line Python file (the file of
bench/prompts/edit-file.jsonl) a few characters at a time; each keystroke's request is
llama.vim's (its `s:fim_send`: the lines above as `input_prefix`, the typed part of the
line as `prompt`, the rest of the file as `input_suffix`, two chunks of other text as
`input_extra`, `n_predict` 128, `t_max_predict_ms` 1000, top-k 40, top-p 0.99,
`samplers: ["top_k", "top_p", "infill"]`, `cache_prompt`), streamed so the first token's
time is seen. llama-server runs as llama.vim's documented presets run it (`-b 1024 -ub
1024 --cache-reuse 256`). Requests go to each server in turn, the order rotated.

Without --target, the model is the default pair's SmolLM2-135M given FIM tokens (its
unused special tokens named fim_pre/suf/mid/pad in a copy's metadata): it was not trained
to fill in the middle, so its completions are poor code, but both servers decode the same
prompts with the same file, which is what the figures compare.
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lib.common import (
    SPECLLAMA,
    Spread,
    add_run_options,
    machine,
    parser,
    resolve_models,
    run,
)
from bench.lib.llamacpp_build import build_tools
from bench.lib.processes import ApiServer

EDITS = Path(__file__).with_name("prompts") / "edit-file.jsonl"
#: SmolLM2's unused special tokens given FIM names (<issue_start>, <issue_comment>,
#: <issue_closed>, <empty_output>; <repo_name> and <file_sep> are llama.cpp's by text).
FIM_IDS = {"fim_pre": 8, "fim_suf": 9, "fim_mid": 10, "fim_pad": 16}
LINE = 68  # the line typed (0-based): `    def transfer(self, source, target, amount, note=""):`


def the_file() -> list[str]:
    """The edit bench's file, as lines."""
    first = json.loads(next(line for line in EDITS.read_text().splitlines()
                            if line.startswith("{")))
    text: str = first["prediction"]
    return text.removeprefix("```python\n").removesuffix("```").split("\n")


def fim_copy(target: Path, out: Path) -> Path:
    """A copy of `target` with FIM token ids in its metadata (gguf's own tool)."""
    if out.exists():
        return out
    flags = [a for name, i in FIM_IDS.items() for a in ("--special-token-by-id", name, str(i))]
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(target),
                    str(out), *flags, "--force"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return out


def keystrokes(lines: list[str], every: int, rep: int) -> list[dict[str, Any]]:
    """llama.vim's request at each `every`-th character typed on LINE; the repetition's
    tag opens the first extra chunk, so no server finds a request of an earlier
    repetition in its cache (that would measure the cache, not the keystrokes)."""
    line = lines[LINE]
    above, below = lines[max(0, LINE - 256):LINE], lines[LINE + 1:LINE + 65]
    extra = [{"filename": "ledger.py",
              "text": f"# repetition {rep + 1}\n" + "\n".join(lines[:30]) + "\n"},
             {"filename": "ledger.py", "text": "\n".join(lines[120:150]) + "\n"}]
    indent = len(line) - len(line.lstrip())
    out = []
    for cut in range(indent + 1, len(line) + 1, every):
        out.append({
            "input_prefix": "\n".join(above) + "\n", "prompt": line[:cut],
            "input_suffix": line[cut:] + "\n" + "\n".join(below) + "\n",
            "input_extra": extra, "n_predict": 128, "n_indent": indent,
            "top_k": 40, "top_p": 0.99, "stream": True,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 1000,
        })
    return out


@dataclass
class Timed:
    first_s: float  # to the first piece of text (or the end, where none came)
    total_s: float
    tokens: int
    evaluated: int  # the prompt tokens the server decoded (not found in its cache)


def infill(port: int, body: dict[str, Any], timeout: float) -> Timed:
    """One streamed /infill request, timed at the client."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        t0 = time.perf_counter()
        conn.request("POST", "/infill", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            sys.exit(f"/infill answered {resp.status}: {resp.read()[:500]!r}")
        first, last = None, {}
        for raw in resp:
            if not raw.startswith(b"data:"):
                continue
            chunk = json.loads(raw[5:])
            if first is None and chunk.get("content"):
                first = time.perf_counter() - t0
            if chunk.get("stop"):
                last = chunk
        total = time.perf_counter() - t0
    finally:
        conn.close()
    return Timed(total if first is None else first, total,
                 int(last.get("tokens_predicted", 0)),
                 int((last.get("timings") or {}).get("prompt_n", 0)))


def servers(args: argparse.Namespace, model: Path) -> dict[str, list[str]]:
    exe = str(build_tools(args.llama_cpp_version, None)["llama-server"])
    return {
        "llama-server": [exe, "-m", str(model), "-t", str(args.threads), "-c",
                         str(args.n_ctx), "-b", "1024", "-ub", "1024", "--cache-reuse", "256",
                         "-np", "1", "--host", "127.0.0.1", "--port"],
        "specllama serve": [*SPECLLAMA, "serve", "--target", str(model), "--draft", "lookup",
                            "--threads", str(args.threads), "--n-ctx", str(args.n_ctx),
                            "--port"],
    }


def main() -> None:
    args = arguments().parse_args()
    import importlib.metadata

    from specllama.paths import cache_dir

    args.llama_cpp_version = importlib.metadata.version("llama_cpp_python")
    if args.target is None:
        smollm2, _ = resolve_models(argparse.Namespace(pair="smollm2", target=None))
        work = cache_dir() / "bench"
        work.mkdir(parents=True, exist_ok=True)
        args.target = fim_copy(smollm2, work / "SmolLM2-135M-Instruct.Q4_1.fim.gguf")
    model = args.target
    lines = the_file()
    n = len(keystrokes(lines, args.every, 0))
    runs: dict[str, list[list[Timed]]] = {}
    started = {name: ApiServer(name, argv[:-1], argv[-1], 300)
               for name, argv in servers(args, model).items()}
    try:
        for rep in range(args.reps):
            for i, body in enumerate(keystrokes(lines, args.every, rep)):
                names = list(started)
                shift = (rep + i) % len(names)
                for name in names[shift:] + names[:shift]:
                    body = {**body, "seed": args.seed + 1000 * rep + i}
                    runs.setdefault(name, [[] for _ in range(args.reps)])[rep].append(
                        infill(started[name].port, body, 300))
    finally:
        for server in started.values():
            server.stop()
    report(runs, args, model, n)


def report(runs: dict[str, list[list[Timed]]], args: argparse.Namespace, model: Path,
           n: int) -> None:
    print(f"{model.name}, {args.threads} threads on {machine()}; {n} keystrokes a "
          f"repetition, {args.reps} repetitions; min / median / max over repetitions")
    print("| server | first request: first token | later keystrokes: first token, median "
          "| tokens/s after the first token | prompt tokens decoded, later keystrokes |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, reps in runs.items():
        first = Spread.of([r[0].first_s * 1000 for r in reps])
        later = Spread.of([Spread.of([t.first_s * 1000 for t in r[1:]]).median for r in reps])
        rate = Spread.of([sum(t.tokens for t in r) / max(1e-9, sum(t.total_s - t.first_s
                                                                  for t in r)) for r in reps])
        decoded = Spread.of([t.evaluated for r in reps for t in r[1:]])
        print(f"| {name} | {first.slashed(0)} ms | {later.slashed(0)} ms | "
              f"{rate.slashed(1)} | {decoded.slashed(0)} |")


def arguments() -> argparse.ArgumentParser:
    p = parser(__doc__)
    p.add_argument("--target", type=Path,
                   help="a GGUF with FIM tokens (default: SmolLM2 given FIM tokens)")
    p.add_argument("--threads", type=int, default=2, help="threads (default: 2)")
    p.add_argument("--n-ctx", type=int, default=4096, help="context window (default: 4096)")
    p.add_argument("--every", type=int, default=4,
                   help="characters typed between two requests (default: 4)")
    p.add_argument("--seed", type=int, default=0)
    add_run_options(p, reps=3)
    return p


if __name__ == "__main__":
    run(main)
