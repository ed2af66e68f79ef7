"""A decode-cost curve: T(n) for n = 1..max_n from the batch sizes timed, the rest
interpolated, never stepping down (a bigger batch never costs less); calibration.py
measures and caches them, the policies read them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CostCurve:
    """seconds[n - 1]: one decode of n tokens. Beyond the end: linear extrapolation."""

    seconds: tuple[float, ...]
    measured: tuple[int, ...] = ()  # the n that were timed (the rest interpolated)
    noise: float = 0.0  # median |T(1) sample - median| / median while measuring

    def __post_init__(self) -> None:
        if not self.seconds or any(not (s > 0 and math.isfinite(s)) for s in self.seconds):
            raise ValueError(f"a cost curve needs positive finite seconds, got {self.seconds!r}")

    @property
    def max_n(self) -> int:
        return len(self.seconds)

    def t(self, n: int) -> float:
        if n <= 0:
            return 0.0
        s = self.seconds
        if n <= len(s):
            return s[n - 1]
        slope = max(0.0, s[-1] - s[-2]) if len(s) >= 2 else s[-1]
        return s[-1] + slope * (n - len(s))

    def ratio(self, n: int) -> float:
        """T(n) / T(1): how much more a batch of n costs than one token."""
        return self.t(n) / self.seconds[0]

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": list(self.seconds), "measured": list(self.measured),
                "noise": self.noise}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostCurve:
        return cls(tuple(float(x) for x in data["seconds"]),
                   tuple(int(n) for n in data.get("measured", ())),
                   float(data.get("noise", 0.0)))

    @classmethod
    def from_points(cls, points: dict[int, float], max_n: int, noise: float = 0.0) -> CostCurve:
        """Fill 1..max_n from timed points by linear interpolation (extrapolation at the end)."""
        ns = sorted(points)
        out = []
        for n in range(1, max_n + 1):
            if n in points:
                out.append(points[n])
                continue
            lo = max((m for m in ns if m < n), default=None)
            hi = min((m for m in ns if m > n), default=None)
            if lo is not None and hi is not None:
                # lo + (hi - lo) * w, not a weighted sum: between equal points that one
                # could come out an ulp apart, and a curve must never step down
                w = (n - lo) / (hi - lo)
                out.append(max(out[-1] if out else 0.0,
                               points[lo] + (points[hi] - points[lo]) * w))
            elif lo is not None:
                prev = max((m for m in ns if m < lo), default=None)
                slope = (points[lo] - points[prev]) / (lo - prev) if prev is not None else 0.0
                out.append(points[lo] + max(0.0, slope) * (n - lo))
            else:
                assert hi is not None  # points is not empty
                out.append(points[hi])
        return cls(tuple(out), tuple(ns), noise)


# ----------------------------------------------------------------------------- measuring


def isotonic(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The closest non-decreasing sequence (pool adjacent violators): a bigger batch
    never costs less, and one noisy point should not make it look so."""
    blocks: list[list[float]] = []  # [weighted mean, weight, count]
    for v, w in zip(values, weights):
        blocks.append([v, float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, c2 = blocks.pop()
            v1, w1, c1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    out: list[float] = []
    for v, _, c in blocks:
        out.extend([v] * int(c))
    return out
