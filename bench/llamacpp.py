"""specllama next to llama.cpp's own speculative decoding, on the same pair of models.

Builds `llama-speculative-simple` and `llama-bench` from the llama.cpp sources inside the
sdist of the installed llama-cpp-python (so both sides run the same llama.cpp), once, into
`<user cache dir>/specllama/llamacpp-<version>/` (or `$SPECLLAMA_CACHE_DIR`). Then, for
each temperature and repetition, one after the other (never two model processes at once):
`specllama bench --modes target,1,2,3,auto --reps 1`, `llama-speculative-simple` on every
prompt with every draft setting of the sweep, and `llama-bench` (the target alone). Same
prompts (specllama's, in the chat template), threads, context, max tokens and seeds.

    python bench/llamacpp.py --pair smollm2-f32
    python bench/llamacpp.py --pair smollm2 --prompt-ids chat-explain --reps 1 --max-tokens 32
    python bench/llamacpp.py --target big.gguf --draft small.gguf --json out.json

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

TOOLS = ("llama-speculative-simple", "llama-bench", "llama-server", "llama-lookup-create")
SPEC_MODES = "target,1,2,3,auto"
FIXED_MODES = ("k=1", "k=2", "k=3")
# Matches `specllama bench` itself; `python -m specllama` has no __main__.
SPECLLAMA = [sys.executable, "-c", "from specllama.cli import main; main()"]


# ------------------------------------------------------------------ building llama.cpp


def build_tools(version: str, sdist: Path | None) -> dict[str, Path]:
    """The tools, built from `vendor/llama.cpp` of the llama-cpp-python sdist of
    `version` (downloaded unless `sdist` is given); reused when already built."""
    from specllama.paths import cache_dir

    root = cache_dir() / f"llamacpp-{version}"
    src, build = root / "src", root / "build"
    bins = {name: build / "bin" / name for name in TOOLS}
    if all(p.exists() for p in bins.values()):
        return bins
    if not (src / "CMakeLists.txt").exists():
        with tempfile.TemporaryDirectory(prefix="specllama-sdist-") as tmp:
            if sdist is None:
                subprocess.run([sys.executable, "-m", "pip", "download",
                                f"llama-cpp-python=={version}", "--no-binary", ":all:",
                                "--no-deps", "-d", tmp], check=True)
                sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
            prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
            with tarfile.open(sdist) as tar:
                members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
                if not members:
                    sys.exit(f"{sdist}: no {prefix} in it (not the sdist of {version}?)")
                for m in members:
                    m.name = m.name[len(prefix):]
                tar.extractall(src, members=[m for m in members if m.name], filter="data")
    print(f"building {', '.join(TOOLS)} in {build} (several minutes)", file=sys.stderr)
    # GGML_NATIVE as llama-cpp-python builds by default; LLAMA_CURL is gone in this
    # llama.cpp (deprecated, ignored): LLAMA_OPENSSL=OFF is what keeps it off the network.
    subprocess.run(["nice", "cmake", "-S", str(src), "-B", str(build),
                    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_OPENSSL=OFF",
                    *no_amx_flags()],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["nice", "cmake", "--build", str(build), "--target", *TOOLS, "-j", "2"],
                   check=True, stdout=subprocess.DEVNULL)
    return bins


def no_amx_flags() -> list[str]:
    """On a CPU with AMX, build without llama.cpp's AMX kernels: built by GCC 12 they crash
    on any batch of quantized tokens (llama.cpp issue 20824), which is why specllama loads
    models without extra buffer types on such a build (engine/llama.py, `_amx_built_in`).
    GCC keeps an explicit -mno-* against -march=native, whatever their order."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    if " amx_int8" not in flags:
        return []
    off = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    return [f"-DCMAKE_C_FLAGS={off}", f"-DCMAKE_CXX_FLAGS={off}"]


# -------------------------------------------------------------------- models, prompts


def resolve_models(args: argparse.Namespace) -> tuple[Path, Path]:
    """The pair's two GGUF files, as specllama itself resolves them (deriving a draft
    into the cache, downloading from Hugging Face) — or --target/--draft as given."""
    if args.target or args.draft:
        if not (args.target and args.draft):
            sys.exit("--target and --draft go together")
        return Path(args.target), Path(args.draft)
    from specllama.errors import SpecLlamaError
    from specllama.models.config import find_and_load_config
    from specllama.models.sources import resolve_pair

    try:
        target, draft = resolve_pair(find_and_load_config(args.config).pair(args.pair))
    except SpecLlamaError as exc:
        sys.exit(str(exc))
    if draft is None:
        sys.exit(f"pair {args.pair!r} has no draft model (lookup): nothing to compare")
    return target, draft


def llamacpp_prompts(target: Path, prompts: list[Any], n_ctx: int) -> dict[str, tuple[str, int]]:
    """Per prompt id: the text to give llama.cpp, and how many tokens it must become.

    `specllama bench` renders the user message with the model's chat template and adds
    BOS only if the model wants one and the template did not write it; llama.cpp's tools
    tokenize with add_special=true (BOS iff the model wants one), so a BOS the template
    wrote is taken off here rather than doubled."""
    from specllama.engine.llama import Model

    model = Model(target, n_ctx=n_ctx, n_threads=1)
    try:
        out = {}
        for p in prompts:
            tokens = model.prompt(p.prompt, chat=p.chat)
            text = p.prompt
            if p.chat and model.chat_template() is not None:
                text = model.format_chat([{"role": "user", "content": p.prompt}])
                bos = model.token_text(model.bos).decode() if model.bos >= 0 else ""
                if model.adds_bos and bos and text.startswith(bos):
                    text = text[len(bos):]
            if model.tokenize(text, add_bos=model.adds_bos, special=True) != tokens:
                sys.exit(f"{p.id}: cannot give llama.cpp the same prompt tokens as specllama")
            out[p.id] = (text, len(tokens))
        return out
    finally:
        model.close()


# ------------------------------------------------------------------------------ parsing

_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in")
# Lines carry a "0.01.234.567 I " log prefix in this llama.cpp; older ones had none.
_COUNTS = re.compile(r"\b(n_draft|n_predict|n_drafted|n_accept)\s+=\s+(\d+)$", re.M)


def parse_speculative(stderr: str) -> dict[str, Any]:
    """The summary llama-speculative-simple prints at the end. Its decode time runs from
    after the prompt (all but its last token) was evaluated on both models to the last
    accepted token: drafting, verifying and sampling, not loading or the prompt."""
    decoded = _DECODED.search(stderr)
    encoded = _ENCODED.search(stderr)
    counts = {k: int(v) for k, v in _COUNTS.findall(stderr)}
    if decoded is None or encoded is None or len(counts) < 4:
        raise ValueError("no llama-speculative-simple summary in its output")
    drafted, accepted = counts["n_drafted"], counts["n_accept"]
    return {"prompt_tokens": int(encoded.group(1)), "tokens": int(decoded.group(1)),
            "decode_s": float(decoded.group(2)), "tokens_per_s": float(decoded.group(3)),
            "n_draft": counts["n_draft"], "drafted": drafted, "accepted": accepted,
            "acceptance": accepted / drafted if drafted else None}


def parse_llama_bench(stdout: str) -> dict[str, Any]:
    """The one test of `llama-bench -o json` (its tokens/s: "avg_ts")."""
    tests = json.loads(stdout)
    if len(tests) != 1:
        raise ValueError(f"expected one llama-bench test, got {len(tests)}")
    return dict(tests[0])


# ------------------------------------------------------------------------------ running


def run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc


def sampling_flags(temp: float) -> list[str]:
    # llama.cpp's defaults (top-k 40, top-p 0.95, min-p 0.05) differ from specllama's.
    return ["--temp", "0"] if temp == 0 else \
        ["--temp", f"{temp:g}", "--top-k", "0", "--top-p", "1", "--min-p", "0"]


def speculative_once(exe: Path, target: Path, draft: Path, prompt_file: Path, temp: float,
                     seed: int, n_max: int, p_min: float, args: argparse.Namespace,
                     schema: str | None = None) -> dict:
    """One run; a prompt with a schema runs with `--json-schema` (llama.cpp's grammar on
    the target's sampler; its drafts are not constrained)."""
    cmd = [str(exe), "-m", str(target), "-md", str(draft), "--spec-type", "draft-simple",
           "-f", str(prompt_file), "-n", str(args.max_tokens), "-c", str(args.n_ctx),
           "-t", str(args.threads), "--spec-draft-threads", str(args.threads), "-s", str(seed),
           "--spec-draft-n-max", str(n_max), "--spec-draft-n-min", "0",
           "--spec-draft-p-min", f"{p_min:g}", *sampling_flags(temp),
           *(["--json-schema", schema] if schema else [])]
    return parse_speculative(run(cmd, args.timeout).stderr)


def specllama_once(args: argparse.Namespace, prompts_file: Path, temp: float, seed: int,
                   out: Path) -> dict:
    models = ["--target", str(args.target), "--draft", str(args.draft)] if args.target \
        else ["--pair", args.pair] + (["--config", args.config] if args.config else [])
    cmd = [*SPECLLAMA, "bench", *models, "--prompts", str(prompts_file), "--modes", SPEC_MODES,
           "--reps", "1", "--max-tokens", str(args.max_tokens), "--seed", str(seed),
           "--threads", str(args.threads), "--n-ctx", str(args.n_ctx),
           "--temperature", f"{temp:g}", "--top-k", "0", "--top-p", "1", "--min-p", "0",
           "--draft-mode", args.draft_mode, "--json", str(out)]
    run(cmd, args.timeout)
    return json.loads(out.read_text())


# ------------------------------------------------------------------------------ summary


def bench_record(p: Any) -> dict[str, Any]:
    """A prompt as a line of a `specllama bench --prompts` file."""
    record = {k: v for k, v in asdict(p).items() if k != "schema"}
    if p.schema is not None:
        record["schema"] = json.loads(p.schema)
    return record


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else 0.0


def summarize(temp: float, ids: list[str], spec_reports: list[dict], lcpp: list[dict],
              tg: list[dict]) -> dict[str, Any]:
    """Medians over repetitions per prompt; the best specllama fixed k and the best
    llama.cpp draft setting are the ones with the highest geometric mean over prompts."""
    runs = [r for rep in spec_reports for r in rep["runs"]]
    ours = {(pid, m): statistics.median(r["tokens_per_s"] for r in runs
                                        if r["prompt"] == pid and r["mode"] == m)
            for pid in ids for m in ("target", "auto", *FIXED_MODES)}
    best_k = max(FIXED_MODES, key=lambda m: geomean([ours[(p, m)] for p in ids]))
    theirs = [r for r in lcpp if r["temperature"] == temp]
    settings = sorted({r["setting"] for r in theirs})

    def stat(pid: str, s: str) -> tuple[float, float | None]:
        rs = [r for r in theirs if r["prompt"] == pid and r["setting"] == s]
        drafted = sum(r["drafted"] for r in rs)
        return (statistics.median(r["tokens_per_s"] for r in rs),
                sum(r["accepted"] for r in rs) / drafted if drafted else None)

    best = max(settings, key=lambda s: geomean([stat(p, s)[0] for p in ids]))
    rows = {pid: {"specllama_target": ours[(pid, "target")], "specllama_auto": ours[(pid, "auto")],
                  "specllama_best_fixed": ours[(pid, best_k)],
                  "llamacpp_spec": stat(pid, best)[0], "llamacpp_acceptance": stat(pid, best)[1]}
            for pid in ids}
    for row in rows.values():
        row["auto_vs_llamacpp_spec"] = row["specllama_auto"] / row["llamacpp_spec"]
    overall: dict[str, float | None] = {k: geomean([rows[p][k] for p in ids]) for k in
               ("specllama_target", "specllama_auto", "specllama_best_fixed", "llamacpp_spec",
                "auto_vs_llamacpp_spec")}
    accs = [a for p in ids if (a := rows[p]["llamacpp_acceptance"]) is not None]
    overall["llamacpp_acceptance"] = statistics.mean(accs) if accs else None
    return {"temperature": temp, "best_fixed_k": best_k, "llamacpp_best_setting": best,
            "llama_bench_tg": statistics.median(t["avg_ts"] for t in tg),
            "llamacpp_settings": {s: geomean([stat(p, s)[0] for p in ids]) for s in settings},
            "per_prompt": rows, "overall": overall}


def print_table(s: dict[str, Any]) -> None:
    t = s["temperature"]
    print(f"\n### T = {t:g}{' (greedy)' if t == 0 else ''}: llama.cpp best: "
          f"{s['llamacpp_best_setting']}; specllama best fixed: {s['best_fixed_k']}\n")
    print("| prompt | specllama target | specllama auto | specllama best k | llama-bench tg "
          "| llama.cpp spec | llama.cpp acceptance | auto / llama.cpp spec |")
    print("| --- " * 8 + "|")
    for name, r in [*s["per_prompt"].items(), ("geomean", s["overall"])]:
        acc = r["llamacpp_acceptance"]
        print(f"| {name} | {r['specllama_target']:.1f} | {r['specllama_auto']:.1f} | "
              f"{r['specllama_best_fixed']:.1f} | {s['llama_bench_tg']:.1f} | "
              f"{r['llamacpp_spec']:.1f} | {'n/a' if acc is None else f'{acc:.0%}'} | "
              f"{r['auto_vs_llamacpp_spec']:.2f}x |")


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """The pair, the llama.cpp sources, the prompts and temperatures: what both
    side-by-side scripts (this one and llamaserver.py) take."""
    parser.add_argument("--pair", default="smollm2-f32", help="pair from models.toml")
    parser.add_argument("--config", help="models.toml to use")
    parser.add_argument("--target", help="target GGUF (with --draft, instead of --pair)")
    parser.add_argument("--draft", help="draft GGUF (with --target)")
    parser.add_argument("--sdist", type=Path, help="local llama-cpp-python sdist (.tar.gz)")
    parser.add_argument("--prompts", help="prompts file as for specllama bench (default: built-in)")
    parser.add_argument("--prompt-ids", help="only these prompts (comma-separated ids)")
    parser.add_argument("--temperatures", default="0,0.8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser)
    # llama-speculative-simple drafts with the model only; specllama's default (hybrid)
    # also copies from the context, so the like-for-like comparison is "model".
    parser.add_argument("--draft-mode", default="model", choices=("model", "hybrid"),
                        help="specllama's draft mode (default: model, as llama.cpp's tool)")
    parser.add_argument("--n-max", default="2,3,4,8", help="llama.cpp --spec-draft-n-max sweep")
    # 0 is this llama.cpp's default; 0.75 was its default in older versions.
    parser.add_argument("--p-min", default="0,0.75", help="llama.cpp --spec-draft-p-min sweep")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0, help="of repetition 0 (then +1 each)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per process")
    parser.add_argument("--json", type=Path, help="write every raw figure as JSON")
    args = parser.parse_args()

    from specllama.cli.bench.prompts import builtin_prompts, load_prompts

    version = importlib.metadata.version("llama_cpp_python")
    target, draft = resolve_models(args)  # first: a wrong pair should not wait for a build
    bins = build_tools(version, args.sdist)
    prompts = load_prompts(args.prompts) if args.prompts else builtin_prompts()
    if args.prompt_ids:
        wanted = args.prompt_ids.split(",")
        prompts = [p for p in prompts if p.id in wanted]
    ids = [p.id for p in prompts]
    temps = [float(t) for t in args.temperatures.split(",")]
    settings = [(int(n), float(p)) for n in args.n_max.split(",") for p in args.p_min.split(",")]
    specs: dict[float, list[dict]] = {t: [] for t in temps}
    lcpp: list[dict] = []
    tg: list[dict] = []  # llama-bench: the target alone, once per repetition
    with tempfile.TemporaryDirectory(prefix="specllama-vs-llamacpp-") as tmp:
        work = Path(tmp)
        prompts_file = work / "prompts.jsonl"
        prompts_file.write_text("".join(json.dumps(bench_record(p)) + "\n" for p in prompts))
        schemas = {p.id: p.schema for p in prompts}
        files = {}
        for pid, (text, n_tokens) in llamacpp_prompts(target, prompts, args.n_ctx).items():
            files[pid] = (work / f"{pid}.txt", n_tokens)
            files[pid][0].write_text(text + "\n")  # `-f` drops one trailing newline: not ours
        for rep in range(args.reps):
            seed = args.seed + rep
            for temp in temps:
                print(f"rep {rep + 1}/{args.reps}, T={temp:g}: specllama bench", file=sys.stderr)
                specs[temp].append(specllama_once(args, prompts_file, temp, seed,
                                                  work / f"specllama-{temp}-{rep}.json"))
                shift = rep % len(settings)  # rotate the order per repetition, as specllama does
                for pid in ids:
                    path, n_tokens = files[pid]
                    for n_max, p_min in settings[shift:] + settings[:shift]:
                        r = speculative_once(bins["llama-speculative-simple"], target, draft,
                                             path, temp, seed, n_max, p_min, args,
                                             schemas[pid])
                        if r["prompt_tokens"] != n_tokens:
                            sys.exit(f"{pid}: llama.cpp saw {r['prompt_tokens']} prompt tokens, "
                                     f"specllama {n_tokens}")
                        r.update(prompt=pid, rep=rep, temperature=temp, seed=seed,
                                 setting=f"n-max {n_max}, p-min {p_min:g}")
                        lcpp.append(r)
                        print(f"  {pid} {r['setting']}: {r['tokens_per_s']:.1f} tok/s",
                              file=sys.stderr)
            out = run([str(bins["llama-bench"]), "-m", str(target), "-p", "0",
                       "-n", str(args.max_tokens), "-t", str(args.threads), "-r", "1",
                       "-o", "json"], args.timeout).stdout
            tg.append(parse_llama_bench(out))
    summary = [summarize(t, ids, specs[t], lcpp, tg) for t in temps]
    print(f"target {target}\ndraft {draft}\nthreads {args.threads}, max tokens {args.max_tokens}, "
          f"reps {args.reps}; tok/s, medians over reps, geometric means over prompts")
    for s in summary:
        print_table(s)
    if args.json:
        args.json.write_text(json.dumps({
            "llama_cpp_python": version, "tools": {k: str(v) for k, v in bins.items()},
            "target": str(target), "draft": str(draft), "args": vars(args),
            "summary": summary, "specllama": {str(t): specs[t] for t in temps},
            "llamacpp_speculative": lcpp, "llama_bench": tg}, indent=1, default=str))


if __name__ == "__main__":
    main()
