"""What any exact greedy drafter of our kind could gain on a request sequence.

Greedy output is the target's own, so it is known in advance. This generates it with
the target alone, request after request, marks every output token as one a lookup
could copy (the m tokens before it, followed by it, occur in the text read before,
m >= 1, 2, 3) and as one the draft model proposes (its argmax, given the exact prefix,
is the token), and then prices schedules of rounds (a round drafts j tokens and the
target adds one: T(j + 1), plus a draft step for each token from the draft model,
which reads each prompt's new part before its first draft of a request):

- the oracle bound: the cheapest schedule (dynamic programming over the output), its
  drafts stopping exactly where the target disagrees and the right one of several
  earlier continuations copied. No drafter that copies from that text and drafts with
  that model in single chains does better at these costs.
- replays without an oracle: lookups as specllama makes them (the longest n-gram that
  occurred before, the tokens after its last occurrence, up to k), else a model draft
  while the draft model's confidence stays >= theta (up to k); the best of a grid.
- specllama itself (auto, lookup,model, drafting from earlier outputs), timed in the same
  process against the target alone.

Costs are priced twice: as calibrated (each model timed alone), and as auto's loop
learnt them while it ran the sequence (a target decode after a draft and a draft step
after a target decode cost more: docs/performance.md), with its overhead per round.

    python -m bench.ceiling --pair smollm2-f32 --prompts requests --max-tokens 96
    python -m bench.ceiling --pair smollm2 --prompts requests --from 3
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.lib.common import add_pair_options, add_run_options, load_decoder, parser, run
from specllama.engine.drafting.ngram import NgramIndex

K_MAX = 15  # drafts a round: the target's curve is calibrated up to 16 tokens


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    output: list[int]
    fresh: int  # tokens of the prompt the draft's cache lacks (after the last request)
    by_model: list[bool]  # the draft model's argmax at each output position is the token
    confidence: list[float]  # the draft model's probability of its argmax there


@dataclass(frozen=True)
class Costs:
    t: Callable[[int], float]  # one target decode of n tokens
    draft_step: float
    read: Callable[[int], float]  # the draft model decoding n tokens in one batch
    round: float = 0.0  # ours, per round (and the draft's wake-up, rounds with a model)
    wake: float = 0.0

    def of(self, j: int, model: int) -> float:
        """A round of j drafts, `model` of them from the draft model."""
        return self.t(j + 1) + self.round + model * self.draft_step \
            + (self.wake if model else 0.0)


def copyable(seen: Sequence[int], text: Sequence[int], start: int, m: int) -> list[bool]:
    """For text[start:], whether each token follows its m predecessors somewhere earlier:
    in `seen` (other text read before) or in text before it."""
    grams = {tuple(seen[i - m : i + 1]) for i in range(m, len(seen))}
    out = []
    for i in range(len(text)):
        gram = tuple(text[max(0, i - m) : i + 1])
        if i >= start:
            out.append(i >= m and gram in grams)
        grams.add(gram)
    return out


def cheapest(known: Sequence[bool], free: Sequence[bool], costs: Costs) -> float:
    """Seconds of the cheapest schedule of rounds over one output: a round at i drafts
    the j <= K_MAX known tokens i..i+j-1 (from the draft model unless free) and emits one
    more of the target's."""
    n = len(known)
    best = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        cost, model = float("inf"), 0
        for j in range(0, min(K_MAX, n - i) + 1):
            if j > 0:
                if not known[i + j - 1]:
                    break
                model += not free[i + j - 1]
            cost = min(cost, costs.of(j, model) + best[min(n, i + j + 1)])
        best[i] = cost
    return best[0]


def oracle(requests: Sequence[Request], first: int, m: int | None, history: bool,
           model: bool, costs: Costs) -> float:
    """Seconds of the oracle's schedule over requests[first:]."""
    seconds, before = 0.0, list[int]()
    for index, r in enumerate(requests):
        text = [*r.prompt, *r.output]
        free = copyable(before if history else [], text, len(r.prompt), m) \
            if m is not None else [False] * len(r.output)
        if index >= first:
            # the draft model drafts only after reading the prompt: where that pays
            known = [f or (model and b) for f, b in zip(free, r.by_model)]
            seconds += min(cheapest(known, free, costs) + costs.read(r.fresh),
                           cheapest(free, free, costs))
        before += text
    return seconds


def propose(index: NgramIndex, k: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix
    that occurred before (none without one): what a context lookup drafts."""
    found = index.match() if k > 0 else None
    return index.continuation(found[0], k) if found is not None else []


def replay(requests: Sequence[Request], first: int, history: bool, m: int | None,
           theta: float | None, k_copy: int, k_model: int, costs: Costs) -> float:
    """Seconds over requests[first:] of a drafter without an oracle: a lookup chain of
    up to k_copy tokens where one matches (the context lookup's index, `NgramIndex`:
    the tokens after the latest earlier occurrence of the longest suffix of m to 8
    tokens; m None: no lookups), else a model draft
    while the draft model's confidence stays >= theta (up to k_model; None: no model).
    The draft model pays for every row it reads, the one that stops it too, and its
    first decode of a round is a batch of what it lacks: the prompt's new part (the
    shared start is in its cache, as in a server after the first request) and what
    other rounds emitted. (Past a wrong draft token its confidences are those read on
    the right prefix: the length of a failed draft is approximate.)"""
    seconds, lookup = 0.0, NgramIndex(m or 1)
    for index, r in enumerate(requests):
        if not history:
            lookup = NgramIndex(m or 1)
        lookup.extend(r.prompt)
        out, i, behind = r.output, 0, r.fresh
        while i < len(out):
            drafted = propose(lookup, min(k_copy, len(out) - i)) if m is not None else []
            model_s = 0.0
            if not drafted and theta is not None:
                limit, j = min(k_model, len(out) - i), 0
                while j < limit and r.confidence[i + j] >= theta:
                    j += 1
                drafted = [out[i + x] if r.by_model[i + x] else -1 for x in range(j)]
                rows = j + 1 if j < limit else j
                model_s = costs.read(behind + 1) + (rows - 1) * costs.draft_step + costs.wake
            accepted = 0
            while accepted < len(drafted) and drafted[accepted] == out[i + accepted]:
                accepted += 1
            if index >= first:
                seconds += costs.of(len(drafted), 0) + model_s
            emitted = min(accepted + 1, len(out) - i)
            behind = 0 if model_s else behind + emitted
            lookup.extend(out[i : i + emitted])
            i += emitted
    return seconds


#: The grid the replays are the best of: the shortest match a lookup copies after, the
#: draft model's lowest confidence it drafts at, and the longest drafts of each.
MATCHES = (1, 2, 3, 4, 6)
THETAS = (0.3, 0.5, 0.7, 0.9, 0.97)


def best_replay(requests: Sequence[Request], first: int, history: bool, lookups: bool,
                model: bool, costs: Costs) -> tuple[float, str]:
    """The fastest replay of the grid, and its settings; never slower than plain steps,
    nor (with lookups) than lookups alone: a drafter may leave the model out."""
    plain = sum(len(r.output) for r in requests[first:]) * costs.of(0, 0)
    best, how = plain, "no drafts"
    thetas: tuple[float | None, ...] = (None,)
    if model:
        thetas = (*THETAS, None) if lookups else THETAS
    for m in (MATCHES if lookups else (None,)):
        for theta in thetas:
            for k_copy in ((2, 4, 8, 15) if lookups else (1,)):
                for k_model in ((2, 4, 8) if theta is not None else (1,)):
                    s = replay(requests, first, history, m, theta, k_copy, k_model, costs)
                    if s < best:
                        best, how = s, (f"m {m} k {k_copy}" if lookups else "") + \
                            (f" theta {theta} k {k_model}" if theta is not None else "")
    return best, how.strip()


def arguments() -> argparse.ArgumentParser:
    p = parser(__doc__)
    add_pair_options(p)
    add_run_options(p, max_tokens=96)
    p.add_argument("--prompts", default="requests",
                   help="a built-in prompt set or a prompts file (default: %(default)s)")
    p.add_argument("--from", dest="first", type=int, default=3,
                   help="the first request counted (1-based; default 3)")
    p.add_argument("--keep-cache", action="store_true",
                   help="keep the KV caches from request to request, as `specllama serve` "
                   "does (the draft model then lacks only a prompt's new part)")
    return p


@dataclass
class Measured:
    """What the models said: each request's target answer and the draft model's view of
    it, the costs calibrated and as auto's loop learnt them, and auto timed."""

    requests: list[Request]
    calibrated: Costs
    learnt: Costs
    alone_s: float
    auto_s: float
    model_drafts: list[int]


def sequence(dec: Any, prompts: list[list[int]], args: argparse.Namespace,
             draft_max: int | str) -> tuple[list[list[int]], float, list[int]]:
    """Outputs, generation seconds over the counted requests, and the tokens the draft
    model drafted in each request, of one sequence."""
    from specllama import SamplingParams
    from specllama.engine.drafting.draftcache import HISTORY_TOKENS
    from specllama.engine.drafting.suffixcache import SuffixArchive

    dec.draft_cache.history = SuffixArchive(HISTORY_TOKENS)  # nothing seen before
    outputs, seconds, by_model = [], 0.0, []
    for index, prompt in enumerate(prompts):
        result = dec.generate(prompt, max_tokens=args.max_tokens, draft_max=draft_max,
                              sampling=SamplingParams(temperature=0.0),
                              keep_cache=args.keep_cache)
        outputs.append(result.tokens)
        seconds += result.stats.generate_s if index >= args.first - 1 else 0.0
        stats = result.stats
        by_model.append(stats.drafted - sum(stats.origin_drafted.values()))
    return outputs, seconds, by_model


def read_requests(draft: Any, prompts: list[list[int]], outputs: list[list[int]],
                  ) -> list[Request]:
    """Each answer as the draft model reads it, given the exact prefix."""
    requests: list[Request] = []
    for prompt, output in zip(prompts, outputs):
        draft.clear()
        draft.decode(prompt[:-1], "none")
        draft.decode([prompt[-1], *output[:-1]], "all")
        rows = [draft.logits_row(i) for i in range(len(output))]
        by_model = [int(np.argmax(row)) == y for row, y in zip(rows, output)]
        confidence = [float(1.0 / np.exp(row - row.max()).sum()) for row in rows]
        last = [*requests[-1].prompt, *requests[-1].output] if requests else []
        shared = next((i for i, (a, b) in enumerate(zip(prompt, last)) if a != b),
                      min(len(prompt), len(last)))
        requests.append(Request(prompt, list(output), len(prompt) - shared, by_model,
                                confidence))
    return requests


def measure(args: argparse.Namespace) -> Measured:
    from specllama import SamplingParams
    from specllama.cli.bench_command.prompts import load_prompts
    from specllama.policy.calibration import DRAFT_MAX_N, TARGET_MAX_N, calibrate
    from specllama.policy.state import AutoState

    dec = load_decoder(args, n_ctx=4096, need_draft=True)
    target, draft = dec.target, dec.draft
    curve = calibrate(target, TARGET_MAX_N).curve
    draft_curve = calibrate(draft, DRAFT_MAX_N, rows="last").curve
    prompts = [target.prompt(p.prompt, chat=p.chat) for p in load_prompts(args.prompts)]
    dec.generate(prompts[0], max_tokens=8, draft_max="auto",
                 sampling=SamplingParams(temperature=0.0))  # warm
    outputs, alone_s, _ = sequence(dec, prompts, args, 0)
    auto_outputs, auto_s, model_drafts = sequence(dec, prompts, args, "auto")
    for index, (mine, theirs) in enumerate(zip(auto_outputs, outputs)):
        if mine != theirs:  # a near-tie that batched and single-token kernels break apart
            at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b),
                      min(len(mine), len(theirs)))
            print(f"note: auto's answer {index + 1} parts from the target alone's at token "
                  f"{at} (a near-tie: float noise between batched and single decodes)")
    loop = AutoState.for_decoder(dec).loop
    requests = read_requests(draft, prompts, outputs)
    dec.close()
    return Measured(requests, Costs(curve.t, draft_curve.t(1), draft_curve.t),
                    Costs(loop.t, loop.draft_step,
                          lambda n: loop.catch_up_s(n) + loop.draft_step,
                          loop.overhead, loop.draft_wake),
                    alone_s, auto_s, model_drafts)


def describe(m: Measured, first: int) -> list[str]:
    """The costs, how often the draft model is right, and auto as measured."""
    counted = m.requests[first:]
    n_tokens = sum(len(r.output) for r in counted)
    out = []
    for name, c in (("calibrated", m.calibrated), ("as the loop learnt them", m.learnt)):
        out.append(f"  costs {name}: T(1) {c.t(1) * 1e3:.1f} ms, T(2) {c.t(2) / c.t(1):.2f}, "
                   f"T(4) {c.t(4) / c.t(1):.2f}, T(8) {c.t(8) / c.t(1):.2f}, draft step "
                   f"{c.draft_step / c.t(1):.2f}, wake {c.wake / c.t(1):.2f}, ours a round "
                   f"{c.round / c.t(1):.2f} T(1)")
    share = sum(sum(r.by_model) for r in counted) / n_tokens
    fresh = sum(r.fresh for r in counted) / len(counted)
    out.append(f"  the draft model's argmax is the target's token at {share:.0%} of "
               f"positions; it reads {fresh:.0f} new prompt tokens a request")
    out.append(f"  specllama auto (lookup,model), measured: {m.alone_s / m.auto_s:.2f}x the target "
               f"alone ({n_tokens / m.auto_s:.1f} against {n_tokens / m.alone_s:.1f} tok/s); "
               f"the draft model drafted {' '.join(map(str, m.model_drafts))} tokens, "
               "request by request")
    return out


#: The oracle's bounds: (label, m, history, model).
BOUNDS: list[tuple[str, int | None, bool, bool]] = [
    ("draft model alone", None, False, True),
    *((f"copies, {seen}{', + model' if model else ''}, m >= {n}", n, history, model)
      for n in (1, 2, 3)
      for seen, history in (("context", False), ("context and history", True))
      for model in (False, True))]
#: The replays: (label, history, lookups, model).
REPLAYS = (("draft model alone", False, False, True),
           ("lookups, context", False, True, False),
           ("lookups, context, + model", False, True, True),
           ("lookups, context and history", True, True, False),
           ("lookups, context and history, + model", True, True, True))


def bounds(requests: Sequence[Request], first: int, c: Costs) -> list[str]:
    """Every oracle bound and best replay at costs c, as speedups over the target alone."""
    alone = sum(len(r.output) for r in requests[first:]) * c.of(0, 0)
    out = ["  the oracle (drafts stop exactly where the target disagrees):"]
    for label, m, history, model in BOUNDS:
        out.append(f"    {label:<46} {alone / oracle(requests, first, m, history, model, c):5.2f}x")
    out.append("  replayed without an oracle (the best of a grid):")
    for label, history, lookups, model in REPLAYS:
        seconds, how = best_replay(requests, first, history, lookups, model, c)
        out.append(f"    {label:<46} {alone / seconds:5.2f}x  ({how})")
    return out


def main() -> None:
    args = arguments().parse_args()
    m = measure(args)
    first = args.first - 1
    n_tokens = sum(len(r.output) for r in m.requests[first:])
    print(f"{args.target or args.pair}, {args.prompts}: requests {args.first}-"
          f"{len(m.requests)}, {n_tokens} tokens")
    print("\n".join(describe(m, first)))
    for name, c in (("calibrated", m.calibrated), ("as the loop learnt them", m.learnt)):
        print(f"costs {name}; x the target alone at the same costs")
        print("\n".join(bounds(m.requests, first, c)))


if __name__ == "__main__":
    run(main)
