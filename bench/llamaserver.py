"""`specllama serve` beside `llama-server`, at the request level, through the OpenAI API.

Both servers run the same llama.cpp: `llama-server` is built from `vendor/llama.cpp` of
the installed llama-cpp-python's sdist (bench/llamacpp.py builds it once into the user
cache). Every server is up at once (an idle one uses no CPU; never two requests at
once) and answers one untimed warm-up request; then every prompt at every temperature
goes to each server in turn as a chat completion (a plain completion for a prompt
marked `"chat": false`) with the same seed, max_tokens and
sampling (top-k, top-p and min-p off on both sides, so T = 0.8 is the same
distribution), timed at the client from the POST to the last byte. Each prompt carries
a tag naming its repetition and temperature, so no server has seen it before (see
`fresh`). Figures: tokens per second of each request (completion tokens over that
time), their geometric mean over the prompts per repetition, then min/median/max over
repetitions; ratios are taken within a repetition. Each server's own draft/accept
counts come from its response (`timings` for llama-server, `speculative` for ours).

    python bench/llamaserver.py --pair smollm2-f32
    python bench/llamaserver.py --pair smollm2 --reps 5 --n-max 2,3 --p-min 0.75
    python bench/llamaserver.py --pair smollm2-f32 --stream --specllama "default;--draft-max 0"

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.metadata
import json
import math
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp import SPECLLAMA, add_common_arguments, build_tools, resolve_models  # noqa: E402

BASELINE = "llama-server"


@dataclass
class Contender:
    name: str
    argv: list[str]  # without the port
    port_flag: str
    kind: str  # "llama-server" or "specllama"
    # per temperature: one list per repetition of per-request records
    runs: dict[float, list[list[dict[str, Any]]]] = field(default_factory=dict)


# ------------------------------------------------------------------------------ servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request(port: int, path: str, body: dict[str, Any] | None, timeout: float,
            stream: bool = False) -> tuple[int, dict[str, Any], float]:
    """POST (or GET when body is None); the JSON answer (a stream: its last chunk that
    has usage or timings, merged) and the seconds from sending to the last byte."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        t0 = time.perf_counter()
        if body is None:
            conn.request("GET", path)
        else:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if not stream or resp.status != 200:
            data = resp.read()
            elapsed = time.perf_counter() - t0
            return resp.status, json.loads(data or b"{}"), elapsed
        merged: dict[str, Any] = {"chunks": 0}
        for line in resp:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            chunk = json.loads(payload)
            merged["chunks"] += 1
            for key in ("usage", "timings", "speculative"):
                if chunk.get(key):
                    merged[key] = chunk[key]
        return resp.status, merged, time.perf_counter() - t0
    finally:
        conn.close()


class Server:
    """One contender's process, from start to a clean stop."""

    def __init__(self, c: Contender, timeout: float, logs: Path | None = None) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([*c.argv, c.port_flag, str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                sys.exit(f"{c.name}: the server exited ({self.proc.returncode}):\n{err[-2000:]}")
            try:
                status, _, _ = request(self.port, "/health", None, 5)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                sys.exit(f"{c.name}: not ready after {timeout:.0f} s")
            time.sleep(0.25)
        _, models, _ = request(self.port, "/v1/models", None, 5)
        self.model = str(models["data"][0]["id"])
        # The pipe is not read here while serving: a chatty server must not block on it.
        log = open(logs / f"{c.name.replace(' ', '_').replace('/', '_')}.log", "wb") \
            if logs else subprocess.DEVNULL
        self._drain = subprocess.Popen(["cat"], stdin=self.proc.stderr, stdout=log)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ------------------------------------------------------------------------------ contenders


def contenders(args: argparse.Namespace, target: Path, draft: Path) -> list[Contender]:
    t = str(args.threads)
    common = ["-m", str(target), "-t", t, "-tb", t, "-c", str(args.n_ctx), "-np", "1",
              "--no-webui", "--host", "127.0.0.1"]
    md = ["-md", str(draft), "-td", t, "-tbd", t]
    out = [Contender(BASELINE, [str(args.bins["llama-server"]), *common], "--port",
                     "llama-server")]
    for n_max in _ints(args.n_max):
        for n_min in _ints(args.n_min):
            for p_min in _floats(args.p_min):
                out.append(Contender(
                    f"llama-server -md n-max {n_max} n-min {n_min} p-min {p_min:g}",
                    [str(args.bins["llama-server"]), *common, *md, "--spec-type", "draft-simple",
                     "--spec-draft-n-max", str(n_max), "--spec-draft-n-min", str(n_min),
                     "--spec-draft-p-min", str(p_min)], "--port", "llama-server"))
    for spec_type in filter(None, args.ngram.split(",")):
        with_draft = spec_type.startswith("draft+")
        name = spec_type.removeprefix("draft+")
        # ngram-cache keeps what it learns across requests only in a dynamic cache file
        # (-lcd), as our suffix cache keeps earlier outputs: give it one, fresh per run.
        # With --corpus it also gets a static cache file (-lcs) built from the same text.
        lcd = []
        if name == "ngram-cache":  # llama-server aborts if the file is missing: an empty one
            path = Path(tempfile.mkdtemp(prefix="lcd-")) / "dynamic.bin"
            path.touch()
            lcd = ["-lcd", str(path)]
            if args.corpus:
                lcd += ["-lcs", str(static_cache(args, target, path.parent / "static.bin"))]
        out.append(Contender(
            f"llama-server {'-md + ' if with_draft else ''}{name}",
            [str(args.bins["llama-server"]), *common, *(md if with_draft else []),
             "--spec-type", f"draft-simple,{name}" if with_draft else name, *lcd],
            "--port", "llama-server"))
    pair = (["--target", str(target), "--draft", str(draft)] if args.target
            else ["--pair", args.pair, *(["--config", args.config] if args.config else [])])
    for flags in args.specllama.split(";"):
        flags = flags.strip()
        extra = [] if flags in ("", "default") else shlex.split(flags)
        out.append(Contender(
            f"specllama {flags or 'default'}",
            [*SPECLLAMA, "serve", *pair, "--threads", t, "--n-ctx", str(args.n_ctx),
             *[f"--corpus={p}" for p in args.corpus], *extra],
            "--port", "specllama"))
    return out


def static_cache(args: argparse.Namespace, target: Path, out: Path) -> Path:
    """llama.cpp's static n-gram cache of the corpus, as `llama-lookup-create` builds it
    from one text: the UTF-8 text files under each --corpus path (hidden entries skipped,
    sorted), joined by blank lines, as `specllama serve --corpus` reads the same files."""
    texts = []
    for root in args.corpus:
        files = [root] if root.is_file() else sorted(
            f for f in root.rglob("*")
            if f.is_file() and not any(part.startswith(".") for part in f.relative_to(root).parts))
        for f in files:
            try:
                data = f.read_bytes()
                if b"\0" not in data[:8192]:
                    texts.append(data.decode("utf-8"))
            except (OSError, UnicodeDecodeError):
                continue
    text = out.with_suffix(".txt")
    text.write_text("\n\n".join(texts), encoding="utf-8")
    subprocess.run([str(args.bins["llama-lookup-create"]), "-m", str(target), "-f", str(text),
                    "-lcs", str(out), "-t", str(args.threads)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"llama-lookup-create: {len(texts)} files, {text.stat().st_size} bytes -> {out}",
          file=sys.stderr)
    return out


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def body(model: str, prompt: str, temp: float, seed: int, max_tokens: int,
         stream: bool, chat: bool = True) -> dict[str, Any]:
    """A chat completion's body, or a plain completion's for a prompt without a template."""
    b: dict[str, Any] = {
        "model": model, "max_tokens": max_tokens, "temperature": temp, "seed": seed,
        "top_k": 0, "top_p": 1.0, "min_p": 0.0, "stream": stream,
    }
    if chat:
        b["messages"] = [{"role": "user", "content": prompt}]
    else:
        b["prompt"] = prompt
    if stream:
        b["stream_options"] = {"include_usage": True}
    return b


def fresh(prompt: str, rep: int, temp: float) -> str:
    """The prompt as no server has seen it: llama-server keeps earlier prompts' KV in RAM
    (`--cache-ram`, 8 GiB by default) and would evaluate a repeated one for free from the
    second repetition on, ours only reuses the previous request's prefix. A tag in front
    leaves both only the chat template's preamble to reuse, as for a new request."""
    return f"(request {rep + 1}-{temp:g})\n{prompt}"


def record(c: Contender, answer: dict[str, Any], seconds: float) -> dict[str, Any]:
    usage = answer.get("usage") or {}
    n = int(usage.get("completion_tokens", 0))
    r: dict[str, Any] = {"tokens": n, "prompt_tokens": usage.get("prompt_tokens"),
                         "seconds": seconds, "tokens_per_s": n / seconds}
    if c.kind == "llama-server":
        timings = answer.get("timings") or {}
        r["drafted"] = int(timings.get("draft_n", 0))
        r["accepted"] = int(timings.get("draft_n_accepted", 0))
        r["server_tokens_per_s"] = timings.get("predicted_per_second")
    else:
        spec = answer.get("speculative") or {}
        r["drafted"] = int(spec.get("drafted", 0))
        r["accepted"] = int(spec.get("accepted", 0))
        r["server_tokens_per_s"] = spec.get("tokens_per_s")
        r["policy"] = spec.get("policy")  # auto's one line: why it drafted as it did
    return r


def run_all(cs: list[Contender], args: argparse.Namespace, prompts: list[Any]) -> None:
    """Every server up at once (an idle one uses no CPU), each request sent to each in
    turn, the order rotated from one prompt to the next: the machine's drift (this VM's
    memory bandwidth swings ±15% over minutes) falls on every contender alike."""
    servers: dict[str, Server] = {}
    try:
        for c in cs:
            server = servers[c.name] = Server(c, args.timeout, args.logs)
            first = prompts[0]
            status, answer, _ = request(
                server.port, "/v1/chat/completions" if first.chat else "/v1/completions",
                body(server.model, first.prompt, 0.0, 0, 8, False, first.chat), args.timeout)
            if status != 200:
                sys.exit(f"{c.name}: warm-up answered {status}: {answer}")
        turn = 0
        for rep in range(args.reps):
            for temp in args.temps:
                rows: dict[str, list[dict[str, Any]]] = {c.name: [] for c in cs}
                for i, p in enumerate(prompts):
                    seed = args.seed + 1000 * rep + i
                    shift = turn % len(cs)
                    turn += 1
                    for c in cs[shift:] + cs[:shift]:
                        server = servers[c.name]
                        status, answer, seconds = request(
                            server.port,
                            "/v1/chat/completions" if p.chat else "/v1/completions",
                            body(server.model, fresh(p.prompt, rep, temp), temp, seed,
                                 args.max_tokens, args.stream, p.chat),
                            args.timeout, stream=args.stream)
                        if status != 200:
                            sys.exit(f"{c.name}: {p.id} answered {status}: {answer}")
                        r = record(c, answer, seconds)
                        r.update(prompt=p.id, seed=seed)
                        rows[c.name].append(r)
                for c in cs:
                    c.runs.setdefault(temp, []).append(rows[c.name])
                    gm = geomean([r["tokens_per_s"] for r in rows[c.name]])
                    print(f"  rep {rep + 1} T={temp:g} {c.name}: {gm:.1f} tok/s", file=sys.stderr)
    finally:
        for server in servers.values():
            server.stop()


# ------------------------------------------------------------------------------ summary


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else 0.0


def spread(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def summarize(cs: list[Contender], temp: float) -> list[dict[str, Any]]:
    base = next(c for c in cs if c.name == BASELINE)
    base_gm = [geomean([r["tokens_per_s"] for r in rows]) for rows in base.runs[temp]]
    lcpp_spec = [c for c in cs if c.kind == "llama-server" and c.name != BASELINE]
    best = max(lcpp_spec, key=lambda c: statistics.median(_gms(c, temp)), default=None)
    out = []
    for c in cs:
        gms = _gms(c, temp)
        rows = [r for reps in c.runs[temp] for r in reps]
        drafted = sum(r["drafted"] for r in rows)
        row: dict[str, Any] = {
            "contender": c.name, "tokens_per_s": spread(gms),
            "vs_llama_server_alone": spread([g / b for g, b in zip(gms, base_gm)]),
            "drafted_per_request": drafted / len(rows),
            "acceptance": sum(r["accepted"] for r in rows) / drafted if drafted else None,
            "tokens_per_request": sum(r["tokens"] for r in rows) / len(rows),
            "best_llama_server_speculative": c is best,
        }
        if best is not None:
            row["vs_best_llama_server_speculative"] = spread(
                [g / b for g, b in zip(gms, _gms(best, temp))])
        out.append(row)
    return out


def _gms(c: Contender, temp: float) -> list[float]:
    return [geomean([r["tokens_per_s"] for r in rows]) for rows in c.runs[temp]]


def _fmt(s: dict[str, float], digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def print_table(temp: float, rows: list[dict[str, Any]]) -> None:
    print(f"\nT = {temp:g}: tok/s and ratios, median [min-max] over repetitions "
          "(* = llama-server's best speculative configuration)")
    print(f"{'contender':52} {'tok/s':>20} {'vs alone':>18} {'vs best -md':>18} "
          f"{'drafted':>8} {'accept':>7}")
    for r in rows:
        star = "*" if r["best_llama_server_speculative"] else " "
        vs_best = r.get("vs_best_llama_server_speculative")
        acc = "" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        print(f"{star}{r['contender'][:51]:51} {_fmt(r['tokens_per_s'], 1):>20} "
              f"{_fmt(r['vs_llama_server_alone']):>18} "
              f"{_fmt(vs_best) if vs_best else '':>18} "
              f"{r['drafted_per_request']:8.1f} {acc:>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser)
    parser.add_argument("--n-max", default="2,3,4", help="llama-server --spec-draft-n-max sweep")
    parser.add_argument("--n-min", default="0", help="llama-server --spec-draft-n-min sweep")
    parser.add_argument("--p-min", default="0,0.75", help="llama-server --spec-draft-p-min sweep")
    parser.add_argument("--ngram", default="",
                        help="llama-server --spec-type values to add, comma-separated "
                             "(prefix 'draft+' to keep -md too), e.g. ngram-mod,draft+ngram-mod")
    parser.add_argument("--specllama", default="--draft-max 0;default;--draft-mode model",
                        help="specllama serve flag sets, ';'-separated ('default': none)")
    parser.add_argument("--stream", action="store_true", help="streamed requests (SSE)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per request/start")
    parser.add_argument("--json", type=Path, help="write every raw figure as JSON")
    parser.add_argument("--logs", type=Path, help="keep each server's log in this folder")
    parser.add_argument("--corpus", type=Path, nargs="+", default=[],
                        help="files or folders: `--corpus` for our servers, a static cache "
                             "(-lcs, built by llama-lookup-create) for llama-server's ngram-cache")
    args = parser.parse_args()
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)

    from specllama.cli.bench.prompts import builtin_prompts, load_prompts

    version = importlib.metadata.version("llama_cpp_python")
    target, draft = resolve_models(args)
    args.bins = build_tools(version, args.sdist)
    args.temps = _floats(args.temperatures)
    prompts = load_prompts(args.prompts) if args.prompts else builtin_prompts()
    if args.prompt_ids:
        prompts = [p for p in prompts if p.id in args.prompt_ids.split(",")]
    cs = contenders(args, target, draft)
    run_all(cs, args, prompts)
    print(f"target {target}\ndraft {draft}\nthreads {args.threads}, max tokens "
          f"{args.max_tokens}, {len(prompts)} prompts, reps {args.reps}, "
          f"{'streamed' if args.stream else 'non-streamed'} requests; "
          "tok/s: geometric mean over prompts of each request's tokens / its time at the client")
    summary = {str(t): summarize(cs, t) for t in args.temps}
    for t in args.temps:
        print_table(t, summary[str(t)])
    if args.json:
        args.json.write_text(json.dumps({
            "llama_cpp_python": version, "target": str(target), "draft": str(draft),
            "args": {k: v for k, v in vars(args).items() if k != "bins"},
            "summary": summary,
            "runs": {c.name: {str(t): reps for t, reps in c.runs.items()} for c in cs},
        }, indent=1, default=str))


if __name__ == "__main__":
    main()
