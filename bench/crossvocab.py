"""What drafting across tokenizers costs per round, beside a target step.

Runs the raw-text prompts (specllama/prompts/text.jsonl) on a cross-vocabulary pair
(default: the built-in `gemma3-smollm2`) with model drafts of a fixed length, and splits
the draft's time into the draft model's decodes and the view's own work
(`CrossVocabDraft.sync_s`: mapping each row to target ids, re-tokenizing the tail of the
text), per round and as a share of the target's verify pass (medians over the prompts).

    python bench/crossvocab.py                        # gemma3-smollm2, k = 3, T = 0 and 0.8
    python bench/crossvocab.py --pair P --k 2 --max-tokens 256

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import statistics


def main() -> None:
    from specllama import SamplingParams, SpeculativeDecoder
    from specllama.cli.bench.prompts import builtin_prompts
    from specllama.engine.crossvocab import CrossVocabDraft
    from specllama.models.config import find_and_load_config
    from specllama.models.sources import resolve_pair

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="gemma3-smollm2")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    target, draft = resolve_pair(find_and_load_config().pair(args.pair))
    dec = SpeculativeDecoder.load(target, draft, n_ctx=2048, n_threads=args.threads,
                                  p_min=0.0, cross_vocab=True)
    drafter = dec.drafter
    assert isinstance(drafter, CrossVocabDraft), "not a cross-vocabulary pair"
    prompts = [dec.target.prompt(p.prompt, chat=False) for p in builtin_prompts("text")]
    dec.generate(prompts[0], max_tokens=4, draft_max=0)  # page the weights in
    print(f"{args.pair}: k = {args.k}, {args.max_tokens} tokens, {len(prompts)} prompts")
    print("T     rounds  target step  draft model/round  view/round  view/target step")
    for temperature in (0.0, 0.8):
        rows = []
        for i, prompt in enumerate(prompts):
            sync0 = drafter.sync_s
            out = dec.generate(prompt, max_tokens=args.max_tokens, draft_max=args.k,
                               draft_mode="model", suffix_cache=False,
                               sampling=SamplingParams(temperature, seed=i))
            s = out.stats
            rounds = max(1, s.target_steps)
            step = s.target_s / rounds  # one verify pass a round
            view = (drafter.sync_s - sync0) / rounds  # draft_s counts it too: take it out
            rows.append((rounds, step, s.draft_s / rounds - view, view, view / step))
        med = [statistics.median(c) for c in zip(*rows)]
        print(f"{temperature:<5} {med[0]:6.0f}  {med[1] * 1e3:8.1f} ms  {med[2] * 1e3:12.2f} ms"
              f"  {med[3] * 1e3:7.2f} ms  {med[4]:12.1%}")
    dec.close()


if __name__ == "__main__":
    main()
