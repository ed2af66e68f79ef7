"""specllama next to llama.cpp's own speculative decoding, on the same pair of models.

Builds `llama-speculative-simple` and `llama-bench` from the llama.cpp sources inside the
sdist of the installed llama-cpp-python (so both sides run the same llama.cpp), once, into
`<user cache dir>/specllama/llamacpp-<version>/` (or `$SPECLLAMA_CACHE_DIR`). Then, for
each temperature and repetition, one after the other (never two model processes at once):
`specllama bench --modes target,1,2,3,auto --reps 1`, `llama-speculative-simple` on every
prompt with every draft setting of the sweep, and `llama-bench` (the target alone). Same
prompts (specllama's, in the chat template), threads, context, max tokens and seeds.

    python -m bench.llamacpp --pair smollm2-f32
    python -m bench.llamacpp --pair smollm2 --prompt-ids chat-explain --reps 1 --max-tokens 32
    python -m bench.llamacpp --target big.gguf --draft small.gguf --json out.json

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.lib.common import SPECLLAMA, add_run_options, geomean, model_flags, parser
from bench.lib.common import run as run_script
from bench.lib.llamacpp_build import (
    add_comparison_options,
    comparison_prompts,
    numbers,
    pair_and_tools,
)

SPEC_MODES = "target,1,2,3,auto"
FIXED_MODES = ("k=1", "k=2", "k=3")


# -------------------------------------------------------------------- models, prompts


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
    # (a synthetic model's text is random bytes, not always UTF-8)
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                          timeout=timeout)
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


def specllama_cmd(args: argparse.Namespace, prompts_file: Path, temp: float, seed: int,
                  out: Path) -> list[str]:
    """`specllama bench` with llama.cpp's prompts, threads, context, seed and sampling."""
    return [*SPECLLAMA, "bench", *model_flags(args), "--prompts", str(prompts_file),
            "--modes", SPEC_MODES,
            "--reps", "1", "--max-tokens", str(args.max_tokens), "--seed", str(seed),
            "--threads", str(args.threads), "--n-ctx", str(args.n_ctx),
            "--temperature", f"{temp:g}", "--top-k", "0", "--top-p", "1", "--min-p", "0",
            "--drafters", args.drafters, "--json", str(out)]


def specllama_once(args: argparse.Namespace, prompts_file: Path, temp: float, seed: int,
                   out: Path) -> dict:
    run(specllama_cmd(args, prompts_file, temp, seed, out), args.timeout)
    return json.loads(out.read_text())


# ------------------------------------------------------------------------------ summary


def bench_record(p: Any) -> dict[str, Any]:
    """A prompt as a line of a `specllama bench --prompts` file."""
    record = {k: v for k, v in asdict(p).items() if k != "schema"}
    if p.schema is not None:
        record["schema"] = json.loads(p.schema)
    return record


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


def arguments() -> argparse.ArgumentParser:
    p = parser(__doc__)
    add_comparison_options(p)
    add_run_options(p, reps=3, max_tokens=128)
    # llama-speculative-simple drafts with the model only; specllama's default also
    # copies from the context (lookup,model), so the like-for-like comparison is "model".
    p.add_argument("--drafters", "--draft-mode", default="model",
                   help="specllama's drafters (default: model, as llama.cpp's tool)")
    p.add_argument("--n-max", default="2,3,4,8", help="llama.cpp --spec-draft-n-max sweep")
    # 0 is this llama.cpp's default; 0.75 was its default in older versions.
    p.add_argument("--p-min", default="0,0.75", help="llama.cpp --spec-draft-p-min sweep")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per process")
    return p


@dataclass
class Figures:
    """Every raw figure: specllama bench reports per temperature, llama.cpp's runs, and
    llama-bench once per repetition (the target alone)."""

    specs: dict[float, list[dict]] = field(default_factory=dict)
    lcpp: list[dict] = field(default_factory=list)
    tg: list[dict] = field(default_factory=list)


def prepare(work: Path, prompts: list[Any], target: Path, n_ctx: int,
            ) -> tuple[Path, dict[str, tuple[Path, int]]]:
    """specllama's prompts file, and per prompt llama.cpp's prompt file and its length."""
    prompts_file = work / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps(bench_record(p)) + "\n" for p in prompts))
    files = {}
    for pid, (text, n_tokens) in llamacpp_prompts(target, prompts, n_ctx).items():
        files[pid] = (work / f"{pid}.txt", n_tokens)
        files[pid][0].write_text(text + "\n")  # `-f` drops one trailing newline: not ours
    return prompts_file, files


def llamacpp_rep(args: argparse.Namespace, bins: dict[str, Path], models: tuple[Path, Path],
                 prompts: list[Any], files: dict[str, tuple[Path, int]], temp: float,
                 rep: int) -> list[dict]:
    """Every prompt with every setting of the sweep, the order rotated per repetition."""
    settings = [(n, p) for n in numbers(args.n_max, int) for p in numbers(args.p_min)]
    shift = rep % len(settings)  # rotated per repetition, as specllama bench does
    out = []
    for prompt in prompts:
        path, n_tokens = files[prompt.id]
        for n_max, p_min in settings[shift:] + settings[:shift]:
            r = speculative_once(bins["llama-speculative-simple"], *models, path, temp,
                                 args.seed + rep, n_max, p_min, args, prompt.schema)
            if r["prompt_tokens"] != n_tokens:
                sys.exit(f"{prompt.id}: llama.cpp saw {r['prompt_tokens']} prompt tokens, "
                         f"specllama {n_tokens}")
            r.update(prompt=prompt.id, rep=rep, temperature=temp, seed=args.seed + rep,
                     setting=f"n-max {n_max}, p-min {p_min:g}")
            out.append(r)
            print(f"  {prompt.id} {r['setting']}: {r['tokens_per_s']:.1f} tok/s",
                  file=sys.stderr)
    return out


def measure(args: argparse.Namespace, bins: dict[str, Path], models: tuple[Path, Path],
            prompts: list[Any], temps: list[float]) -> Figures:
    figures = Figures({t: [] for t in temps})
    with tempfile.TemporaryDirectory(prefix="specllama-vs-llamacpp-") as tmp:
        prompts_file, files = prepare(Path(tmp), prompts, models[0], args.n_ctx)
        for rep in range(args.reps):
            for temp in temps:
                print(f"rep {rep + 1}/{args.reps}, T={temp:g}: specllama bench", file=sys.stderr)
                figures.specs[temp].append(specllama_once(
                    args, prompts_file, temp, args.seed + rep,
                    Path(tmp) / f"specllama-{temp}-{rep}.json"))
                figures.lcpp += llamacpp_rep(args, bins, models, prompts, files, temp, rep)
            out = run([str(bins["llama-bench"]), "-m", str(models[0]), "-p", "0",
                       "-n", str(args.max_tokens), "-t", str(args.threads), "-r", "1",
                       "-o", "json"], args.timeout).stdout
            figures.tg.append(parse_llama_bench(out))
    return figures


def main() -> None:
    args = arguments().parse_args()
    version, target, draft, bins = pair_and_tools(args)
    assert draft is not None  # (no --mtp here: a draft model)
    prompts = comparison_prompts(args)
    ids = [p.id for p in prompts]
    temps = numbers(args.temperatures)
    f = measure(args, bins, (target, draft), prompts, temps)
    summary = [summarize(t, ids, f.specs[t], f.lcpp, f.tg) for t in temps]
    print(f"target {target}\ndraft {draft}\nthreads {args.threads}, max tokens "
          f"{args.max_tokens}, reps {args.reps}; tok/s, medians over reps, geometric means "
          "over prompts")
    for s in summary:
        print_table(s)
    if args.json:
        args.json.write_text(json.dumps({
            "llama_cpp_python": version, "tools": {k: str(v) for k, v in bins.items()},
            "target": str(target), "draft": str(draft), "args": vars(args),
            "summary": summary, "specllama": {str(t): f.specs[t] for t in temps},
            "llamacpp_speculative": f.lcpp, "llama_bench": f.tg}, indent=1, default=str))


if __name__ == "__main__":
    run_script(main)
