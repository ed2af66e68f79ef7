"""What drafting across tokenizers costs per round, beside a target step.

Runs the raw-text prompts (specllama/prompts/text.jsonl) on a cross-vocabulary pair
(default: the built-in `gemma3-smollm2`) with model drafts of a fixed length, and splits
the draft's time into the draft model's decodes and the view's own work
(`CrossVocabDraft.sync_s`: mapping each row to target ids, re-tokenizing the tail of the
text), per round and as a share of the target's verify pass (medians over the prompts).

    python -m bench.crossvocab                        # gemma3-smollm2, k = 3, T = 0 and 0.8
    python -m bench.crossvocab --pair P --k 2 --max-tokens 256

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from bench.lib.common import add_pair_options, add_run_options, load_decoder, parser, run

#: One prompt's figures: rounds, a target verify pass (s), the draft model's decodes a
#: round (s), the view's own work a round (s), and that work over a verify pass.
Row = tuple[float, float, float, float, float]


def round_costs(stats: Any, view_s: float) -> Row:
    """A generation's figures from its stats (`target_steps`, `target_s`, `draft_s`) and
    the view's seconds in it, which `draft_s` counts too and which are taken out of it."""
    rounds = max(1, stats.target_steps)
    step = stats.target_s / rounds  # one verify pass a round
    view = view_s / rounds
    return rounds, step, stats.draft_s / rounds - view, view, view / step


def median_line(temperature: float, rows: Sequence[Row]) -> str:
    med = [statistics.median(c) for c in zip(*rows)]
    return (f"{temperature:<5} {med[0]:6.0f}  {med[1] * 1e3:8.1f} ms  {med[2] * 1e3:12.2f} ms"
            f"  {med[3] * 1e3:7.2f} ms  {med[4]:12.1%}")


def main() -> None:
    from specllama import SamplingParams
    from specllama.cli.bench_command.prompts import builtin_prompts
    from specllama.engine.drafting.crossvocab import CrossVocabDraft
    from specllama.errors import InvalidParameterError

    p = parser(__doc__)
    add_pair_options(p, pair="gemma3-smollm2")
    add_run_options(p, max_tokens=128)
    p.add_argument("--k", type=int, default=3, help="draft length (default: %(default)s)")
    args = p.parse_args()
    dec = load_decoder(args, n_ctx=2048, need_draft=True, p_min=0.0, cross_vocab=True)
    drafter = dec.draft_model
    if not isinstance(drafter, CrossVocabDraft):
        raise InvalidParameterError(f"{args.target or args.pair}: not a cross-vocabulary pair")
    prompts = [dec.target.prompt(q.prompt, chat=False) for q in builtin_prompts("text")]
    dec.generate(prompts[0], max_tokens=4, draft_max=0)  # page the weights in
    print(f"{args.target or args.pair}: k = {args.k}, {args.max_tokens} tokens, "
          f"{len(prompts)} prompts")
    print("T     rounds  target step  draft model/round  view/round  view/target step")
    for temperature in (0.0, 0.8):
        rows = []
        for i, prompt in enumerate(prompts):
            sync0 = drafter.sync_s
            out = dec.generate(prompt, max_tokens=args.max_tokens, draft_max=args.k,
                               drafters=("model",), draft_cache=False,
                               sampling=SamplingParams(temperature, seed=i))
            rows.append(round_costs(out.stats, drafter.sync_s - sync0))
        print(median_line(temperature, rows))
    dec.close()


if __name__ == "__main__":
    run(main)
