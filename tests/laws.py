"""Exact laws of the target alone, for the statistical tests: the probability of each
path of its first tokens, walked through its own logits."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from specllama.engine.llama import Model


def exact_joint(model: Model, prompt: list[int], n: int,
                p_after: Callable[[tuple, np.ndarray], np.ndarray]) -> dict:
    """P(x1..xn) for the target alone: `p_after(path, logits)` turns the target's row
    after prompt + path into the distribution drawn from (a rule of the path applied
    first: penalties, a budget). A path that ends early is a shorter key."""
    joint: dict = {}

    def walk(path: tuple, prob: float) -> None:
        p = p_after(path, model.logits_row(-1))
        # under 1e-9 left out: at most ids x 1e-9 of the mass a step, and a draw there
        # fails the test (an outcome the target never gives), it cannot pass it
        for x in np.flatnonzero(p > 1e-9):
            key, mass = (*path, int(x)), prob * float(p[x])
            if model.is_eog(int(x)) or len(key) == n:
                joint[key] = joint.get(key, 0.0) + mass
                continue
            model.truncate(len(prompt) + len(path))
            model.decode([int(x)], "last")
            walk(key, mass)

    model.clear()
    model.decode(prompt, "last")
    walk((), 1.0)
    model.clear()
    return joint
