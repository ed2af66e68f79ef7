"""Greedy identity under `serve --parallel` at long positions: near-ties, not breaks.

A 2,000-token greedy stream served beside another once differed from the same request
alone after ~1,800 tokens. The cause is llama.cpp's numerics, not our KV bookkeeping: a
sequence's cells in a shared (unified) cache are scattered among the other's as drafts
are rejected and cells reused, and CPU flash attention's narrow path accumulates them in
cell order in F16, so the same text's logits move by a few thousandths. Measured on the
tiny F32 model at that position: the two tokens' logits 0.0011 apart, and that gap
ranging over -0.0004..+0.0041 across nine fragmentations of the cache by another
sequence. So a difference is allowed only where the target, decoding the common text
alone, puts the two tokens within TIE of each other; a real break (a wrong cell, a
stale state) picks a token far behind the best one and fails."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from drafts import GREEDY

from specllama import SpeculativeDecoder
from specllama.engine.llama import Model
from specllama.loading import measure_costs
from specllama.server.jobs import Order
from specllama.server.prompts import Work
from specllama.server.slots import Slots

TIE = 0.01  # logits; ~2.5x the largest spread measured (module docstring)
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
    at = first_difference(reference, served)
    if at is not None:  # allowed only at a near-tie
        gap = lone_gap(tiny_target, prompt + reference[:at], reference[at], served[at])
        assert abs(gap) < TIE, f"token {at}: {served[at]} is {gap:.4f} behind {reference[at]}"
    # The check tells a break from a tie: a token ranked 10th at position 1,000 is
    # far more than TIE behind the one the target chose there.
    text = prompt + reference[:1000]
    model = Model(tiny_target, n_ctx=N_CTX, n_threads=1)
    try:
        model.decode(text, "last")
        tenth = int(np.argsort(np.asarray(model.logits_row(-1)))[-10])
    finally:
        model.close()
    assert lone_gap(tiny_target, text, reference[1000], tenth) > 10 * TIE
