"""How busy the machine is: the noise indicator for timings (bench, calibration)."""

from __future__ import annotations

import os
import time

#: /proc/stat counts in ticks of 10 ms: shorter spans cannot tell busy from idle.
MIN_WALL_S = 0.25
#: Other processes used this share of the CPU during a run: its figures are not the
#: machine's (the stats say so).
BUSY_WARN = 0.25


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not on every platform
        return os.cpu_count() or 1


def threads_for(busy: float | None, n_cores: int) -> int:
    """Threads for llama.cpp when other processes use `busy` of the CPU. Its threads wait for
    each other at every step, so one thread on a core another process is using stalls them all
    (docs/performance.md, #what-specllamas-own-machinery-costs): use the cores that are free."""
    if busy is None:
        return n_cores
    free = n_cores * (1.0 - busy)
    return max(1, min(n_cores, int(free + 0.3)))


def loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # pragma: no cover - not on every platform
        return None


class CpuMeter:
    """Share of the machine's CPU time used by OTHER processes between start()
    and stop(): the bench's noise indicator (Linux /proc/stat; None elsewhere)."""

    def __init__(self) -> None:
        self._start: tuple[float, float, float] | None = None

    @staticmethod
    def _read() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat", encoding="ascii") as fh:
                vals = [int(x) for x in fh.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        busy = (sum(vals[:8]) - vals[3] - vals[4]) / tick  # all but idle and iowait
        t = os.times()
        return busy, t.user + t.system, time.monotonic()

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> float | None:
        end = self._read()
        if self._start is None or end is None:
            return None
        busy, own, wall = (e - s for e, s in zip(end, self._start))
        if wall < MIN_WALL_S:
            return None
        return max(0.0, min(1.0, (busy - own) / (wall * (os.cpu_count() or 1))))
