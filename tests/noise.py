"""This CPU's float noise in llama.cpp's logits, for the tests that compare rows of two
decodes of one text (issue #64: tolerances that hold on any CPU).

The same text decoded in other batches sums in another order: a batch of one token takes
other kernels than a batch of many. Measured on an AMD EPYC (largest |difference| in a
row, against one batch): 1e-6 to 8e-4 on the tiny llama, Qwen3.5, LFM2 and Mamba models,
up to 0.006 on the tiny Gemma 3, 0.002 on the tiny llama at 1,800 tokens, 0 on SmolLM2
Q4_1 (every split bit-exact); under 1e-3 on the tiny Gemma 3 on an Intel Xeon. So a test
measures the noise on its own text, allows TIMES that, and asserts that its bound stays
MARGIN times short of what the bug it catches is off by."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from specllama.engine.llama import Model

#: The splits measured are a few of many: any other first | 1 | rest split came within ~4x
#: of the largest measured (tiny models, AMD EPYC); 10x leaves room for the rest.
TIMES = 10
#: A bound a fifth of the bug or less: a bug off by less than 5x the bound would pass.
MARGIN = 5
#: Logits: the least a real break moves a row by, where a test cannot measure its own. A
#: stale recurrent state: ~1.9 (issue #64), 5.3-13.5 on the tiny Qwen3.5 and LFM2 (AMD
#: EPYC); a row one position off: 8 or more on the tiny llama; another token fed to an
#: EAGLE3 or Gemma 4 head: 10 or more; SmolLM2's other attention path: 0.98.
BREAK = 0.5
#: The least noise a comparison allows for: a split not measured may take another kernel,
#: which moves the tiny models' rows by 1e-4 to 6e-3 (AMD EPYC). TIMES this is 1e-3, the
#: tolerance these tests used before; a test needing less says why.
FLOOR = 1e-4


def last_row(model: Any, tokens: Sequence[int], cuts: Sequence[int]) -> np.ndarray:
    """The last row of `tokens`, decoded from a cleared cache in batches ending at `cuts`
    (and at the end). `model`: a Model, or a draft whose target holds what it reads."""
    model.clear()
    start = 0
    for end in [*(c for c in cuts if 0 < c < len(tokens)), len(tokens)]:
        if end > start:
            model.decode(list(tokens[start:end]), "last" if end == len(tokens) else "none")
            start = end
    return np.asarray(model.logits_row(-1), dtype=np.float64).copy()


def apart(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |a - b| over the finite entries (an EAGLE3 head's q is -inf outside its
    vocabulary); infinite where the two are not -inf at the same entries."""
    finite = np.isfinite(a)
    if not np.array_equal(finite, np.isfinite(b)):
        return float("inf")
    return float(np.abs(a[finite] - b[finite]).max(initial=0.0))


def spread(model: Any, tokens: Sequence[int],
           shapes: Sequence[Sequence[int]]) -> tuple[np.ndarray, float]:
    """The last row of `tokens` decoded in the first of `shapes` (cuts, as `last_row`
    takes them), and how far the others move it: this CPU's noise there. Leaves the
    model cleared."""
    rows = [last_row(model, tokens, cuts) for cuts in shapes]
    model.clear()
    return rows[0], max((apart(r, rows[0]) for r in rows[1:]), default=0.0)


def rounds(kept: int, n: int, size: int) -> list[int]:
    """Cuts for tokens[:kept] in one batch, then rounds of `size` up to n."""
    return [kept, *range(kept + size, n, size)]


def split_noise(model: Any, tokens: Sequence[int], *firsts: int) -> float:
    """How far the last row of `tokens` moves with the batch split alone, no cut: decoded
    one token at a time, and as first | 1 | rest (for each of `firsts` and the middle),
    against one batch. The one-token batches are where this CPU's kernels differ."""
    n = len(tokens)
    shapes = [[], rounds(0, n, 1), *([f, f + 1] for f in (*firsts, n // 2))]
    return spread(model, tokens, shapes)[1]


def file_split_noise(path: Any, tokens: Sequence[int], *firsts: int, n_threads: int = 1,
                     n_ctx: int = 256) -> float:
    """`split_noise` of a model file, loaded for the measure."""
    model = Model(path, n_ctx=n_ctx, n_threads=n_threads)
    try:
        return split_noise(model, tokens, *firsts)
    finally:
        model.close()


def tolerance(noise: float, bug: float = BREAK, floor: float = FLOOR) -> float:
    """TIMES the measured noise (at least TIMES `floor`), asserted to stay MARGIN times
    short of `bug`, what the bug the comparison catches is off by."""
    bound = TIMES * max(noise, floor)
    assert MARGIN * bound <= bug, (
        f"this CPU's float noise ({noise:.2e}) is too close to the bug the test catches "
        f"({bug:.2e}) to tell them apart")
    return bound


#: The floor of comparisons that must see 1e-3 (a greedy tie; where llama.cpp's batch
#: sides part): 1e-5, so the bound stays 1e-4 where every split is bit-exact (SmolLM2 on
#: an AMD EPYC). A break batched across attention paths parted SmolLM2 at a gap of 1e-3.
EXACT_FLOOR = 1e-5


def assert_a_tie(probe: Any, prompt: Sequence[int], generated: Sequence[int],
                 label: str) -> None:
    """A greedy run parted from the target alone after `generated`: that is allowed only
    where the target's two best logits there are within this CPU's noise. The row is
    read as the target alone reads it (the prompt in one batch, then token by token), its
    noise from the rounds a verify pass decodes instead (2 to 5 tokens)."""
    tokens = [*prompt, *generated]
    shapes = [rounds(len(prompt), len(tokens), size) for size in (1, 2, 3, 4, 5)]
    row, noise = spread(probe, tokens, shapes)
    top = np.sort(row)[-2:]
    bound = tolerance(noise, floor=EXACT_FLOOR)
    assert top[1] - top[0] < bound, (
        f"{label}: parted at {len(generated)}, where the two best logits are "
        f"{top[1] - top[0]:.2e} apart: over the {bound:.1e} this CPU's noise there allows")
