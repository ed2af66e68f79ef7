"""Greedy identity under `serve --parallel` at long positions: near-ties, not breaks.

A 2,000-token greedy stream served beside another once differed from the same request
alone after ~1,800 tokens. The cause is llama.cpp's numerics, not our KV bookkeeping: a
sequence's cells in a shared (unified) cache are scattered among the other's as drafts
are rejected and cells reused, and CPU flash attention's narrow path accumulates them in
cell order in F16, so the same text's logits move by a few thousandths. Measured on the
tiny F32 model at that position: the two tokens' logits 0.0011 apart, and that gap
ranging over -0.0004..+0.0041 across nine fragmentations of the cache by another
sequence. So a difference is allowed only where the target, decoding the common text
alone, puts the two tokens within this CPU's noise there of each other (`tie`); a real
break (a wrong cell, a stale state) picks a token far behind the best one and fails."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from drafts import GREEDY
from noise import rounds, spread, tolerance

from specllama import SpeculativeDecoder
from specllama.engine.llama import Model
from specllama.loading import measure_costs
from specllama.server.jobs import Order
from specllama.server.prompts import Work
from specllama.server.slots import Slots

#: Logits: the least noise allowed for at these positions; ten times it is 0.01, ~2.5x the
#: largest spread fragmentation gave (module docstring).
TIE_FLOOR = 0.001
N_CTX = 4096


def lone_gap(target: Path, text: list[int], best: int, other: int) -> float:
    """logit(best) - logit(other) after `text`, decoded alone in narrow rounds of 4
    tokens, as generation decodes (a wide batch takes another attention path)."""
    model = Model(target, n_ctx=N_CTX, n_threads=1)
    try:
        for i in range(0, len(text), 4):
            model.decode(text[i:i + 4], "last")
        row = np.asarray(model.logits_row(-1), dtype=np.float64)
        return float(row[best] - row[other])
    finally:
        model.close()


def tie(target: Path, text: list[int], far: float) -> float:
    """Ten times this CPU's noise after `text` (noise.tolerance): how far its row moves
    decoded in rounds of 1, 2 or 3 tokens instead of 4 (0.002 at 1,800 tokens on an AMD
    EPYC, where the cells' order moved the gap by up to 0.0045), asserted well short of
    `far`, a break."""
    model = Model(target, n_ctx=N_CTX, n_threads=1)
    try:
        _, noise = spread(model, text, [rounds(0, len(text), n) for n in (4, 1, 2, 3)])
    finally:
        model.close()
    return tolerance(noise, bug=far, floor=TIE_FLOOR)


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def test_a_long_stream_beside_another_differs_from_alone_only_at_a_near_tie(
        tiny_target, tiny_draft):
    decoder = SpeculativeDecoder(Model(tiny_target, n_ctx=N_CTX, n_threads=1, n_seq=2),
                                 Model(tiny_draft, n_ctx=N_CTX, n_threads=1, n_seq=2))
    slots = Slots(decoder, lambda: measure_costs(decoder, "auto", False, lambda _: None))
    prompt = decoder.tokenize("a b c d e f g")

    def order(i: int, tokens: list[int], n: int) -> Order:
        return Order(i, Work("completion", tokens, n, GREEDY, ()), "end", 3,
                     ("lookup", "model"))

    def run(o: Order, out: dict[int, list[int]]) -> None:
        outcome = slots.run(o, lambda e: None, lambda: False)
        assert outcome.failure is None and outcome.result is not None, outcome.failure
        out[o.id] = list(outcome.result.tokens)

    try:
        slots.prepare()
        alone: dict[int, list[int]] = {}
        run(order(0, prompt, 2000), alone)
        got: dict[int, list[int]] = {}
        beside = [threading.Thread(target=run, args=(order(1, prompt, 2000), got)),
                  threading.Thread(target=run, args=(
                      order(2, decoder.tokenize("the cat and the dog"), 2500), got))]
        for t in beside:
            t.start()
        for t in beside:
            t.join()
    finally:
        slots.close()
    reference, served = alone[0], got[1]
    assert len(served) == len(reference) == 2000
    # The check tells a break from a tie: a token ranked 10th at position 1,000 is far
    # behind the one the target chose there (2.84 on an AMD EPYC), beyond any tie allowed.
    text = prompt + reference[:1000]
    model = Model(tiny_target, n_ctx=N_CTX, n_threads=1)
    try:
        model.decode(text, "last")
        tenth = int(np.argsort(np.asarray(model.logits_row(-1)))[-10])
    finally:
        model.close()
    far = lone_gap(tiny_target, text, reference[1000], tenth)
    tolerance(0.0, bug=far, floor=TIE_FLOOR)  # the least tie allowed is well short of it
    at = first_difference(reference, served)
    if at is not None:  # allowed only at a near-tie
        common = prompt + reference[:at]
        gap = lone_gap(tiny_target, common, reference[at], served[at])
        assert abs(gap) < tie(tiny_target, common, far), \
            f"token {at}: {served[at]} is {gap:.4f} behind {reference[at]}"
