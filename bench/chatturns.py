"""A conversation that grows turn by turn, timed with its prompts: auto vs the target alone.

`specllama bench` times generation only; in a chat every turn's prompt is the whole
conversation, and what a draft model spends on it (up front, or catching up later) is
part of what the user waits for. This runs the built-in prompts (`bench`, then `text`)
as the user turns of one conversation in SmolLM2's chat format, each answer appended
before the next turn, and times each `generate` call whole (prompt included): tokens
per second over the conversation, auto (hybrid) and the target alone alternating,
`--reps` times each, in one process. As in `specllama chat`, each call keeps the KV
cache of the conversation so far, and lookups copy from the earlier turns; each
repetition is a new session (the decoder's memory of earlier outputs is emptied), or
auto would copy its answers from the last one.

    python bench/chatturns.py --pair smollm2-f32
    python bench/chatturns.py --pair smollm2 --turns 10 --reps 3

To compare two versions of specllama, run it from a checkout of each, one after the
other, on an idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    from specllama import SamplingParams, SpeculativeDecoder
    from specllama.cli.bench.prompts import builtin_prompts
    from specllama.engine.draftcache import HISTORY_TOKENS
    from specllama.engine.suffixcache import SuffixArchive
    from specllama.models.config import find_and_load_config
    from specllama.models.sources import resolve_pair

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="smollm2-f32")
    ap.add_argument("--turns", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    target, draft = resolve_pair(find_and_load_config().pair(args.pair))
    dec = SpeculativeDecoder.load(target, draft, n_ctx=4096, n_threads=args.threads)
    greedy = SamplingParams(temperature=0.0)
    dec.generate("Hello", max_tokens=4, draft_max="auto")  # calibrated before the clock
    questions = [p.prompt for p in builtin_prompts("bench") + builtin_prompts("text")]
    rates: dict[str, list[float]] = {"auto": [], "target": []}
    context = 0
    for _ in range(args.reps):
        for name, draft_max in (("auto", "auto"), ("target", 0)):
            history, seconds, tokens = "", 0.0, 0
            dec.suffix_cache.history = SuffixArchive(HISTORY_TOKENS)  # a new session
            for question in questions[: args.turns]:
                history += f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
                t0 = time.perf_counter()
                out = dec.generate(history, max_tokens=args.max_tokens, draft_max=draft_max,
                                   sampling=greedy, keep_cache=True)
                seconds += time.perf_counter() - t0
                tokens += len(out.tokens)
                history += out.text + "<|im_end|>\n"
            rates[name].append(tokens / seconds)
            context = len(dec.tokenize(history))
    dec.close()
    for name, rs in rates.items():
        print(f"{name:7s} tok/s " + " ".join(f"{r:.1f}" for r in rs))
    ratios = [a / t for a, t in zip(rates["auto"], rates["target"])]
    print(f"auto / target alone: {statistics.median(ratios):.2f} "
          f"[{min(ratios):.2f}-{max(ratios):.2f}] over {args.reps} repetitions; "
          f"{args.turns} turns, {context} tokens of conversation at the end")


if __name__ == "__main__":
    main()
