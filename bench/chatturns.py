"""A conversation that grows turn by turn, timed with its prompts: auto vs the target alone.

`specllama bench` times generation only; in a chat every turn's prompt is the whole
conversation, and what a draft model spends on it (up front, or catching up later) is
part of what the user waits for. This runs the built-in prompts (`bench`, then `text`)
as the user turns of one conversation in SmolLM2's chat format, each answer appended
before the next turn, and times each `generate` call whole (prompt included): tokens
per second over the conversation, auto (lookup,model) and the target alone alternating,
`--reps` times each, in one process. As in `specllama chat`, each call keeps the KV
cache of the conversation so far, and lookups copy from the earlier turns; each
repetition is a new session (the decoder's memory of earlier outputs is emptied), or
auto would copy its answers from the last one.

    python -m bench.chatturns --pair smollm2-f32
    python -m bench.chatturns --pair smollm2 --turns 10 --reps 3

To compare two versions of specllama, run it from a checkout of each, one after the
other, on an idle machine.
"""

from __future__ import annotations

import time
from typing import Any

from bench.lib.common import Spread, add_pair_options, add_run_options, load_decoder, parser, run

MODES = (("auto", "auto"), ("target", 0))


def user_turn(question: str) -> str:
    """A user turn and the assistant's opening, in SmolLM2's chat format."""
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def conversation(dec: Any, questions: list[str], draft_max: int | str,
                 max_tokens: int) -> tuple[float, str]:
    """Tokens per second over one conversation, each call timed whole; its text."""
    from specllama import SamplingParams
    from specllama.engine.drafting.draftcache import HISTORY_TOKENS
    from specllama.engine.drafting.suffixcache import SuffixArchive

    history, seconds, tokens = "", 0.0, 0
    dec.draft_cache.history = SuffixArchive(HISTORY_TOKENS)  # a new session
    for question in questions:
        history += user_turn(question)
        t0 = time.perf_counter()
        out = dec.generate(history, max_tokens=max_tokens, draft_max=draft_max,
                           sampling=SamplingParams(temperature=0.0), keep_cache=True)
        seconds += time.perf_counter() - t0
        tokens += len(out.tokens)
        history += out.text + "<|im_end|>\n"
    return tokens / seconds, history


def summary(rates: dict[str, list[float]], turns: int, context: int) -> list[str]:
    """Each mode's tokens/s per repetition, and auto / target alone within each."""
    out = [f"{name:7s} tok/s " + " ".join(f"{r:.1f}" for r in rs) for name, rs in rates.items()]
    ratios = [a / t for a, t in zip(rates["auto"], rates["target"])]
    out.append(f"auto / target alone: {Spread.of(ratios).bracket()} over {len(ratios)} "
               f"repetitions; {turns} turns, {context} tokens of conversation at the end")
    return out


def main() -> None:
    from specllama.cli.bench_command.prompts import builtin_prompts

    p = parser(__doc__)
    add_pair_options(p)
    add_run_options(p, reps=2, max_tokens=96)
    p.add_argument("--turns", type=int, default=7)
    args = p.parse_args()
    dec = load_decoder(args, n_ctx=4096)
    dec.generate("Hello", max_tokens=4, draft_max="auto")  # calibrated before the clock
    questions = [q.prompt for q in builtin_prompts("bench") + builtin_prompts("text")]
    rates: dict[str, list[float]] = {name: [] for name, _ in MODES}
    history = ""
    for _ in range(args.reps):
        for name, draft_max in MODES:
            rate, history = conversation(dec, questions[: args.turns], draft_max,
                                         args.max_tokens)
            rates[name].append(rate)
    context = len(dec.tokenize(history))
    dec.close()
    print("\n".join(summary(rates, args.turns, context)))


if __name__ == "__main__":
    run(main)
