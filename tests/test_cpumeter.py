"""The busy-machine indicator that keeps noisy timings out of caches and figures."""

import os
import subprocess
import sys
import time

import pytest

from specllama.policy.cpumeter import MIN_WALL_S, CpuMeter

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"),
                                reason="reads Linux's /proc/stat: Linux only")


def test_another_busy_process_is_seen():
    meter = CpuMeter()
    meter.start()
    spin = "import time\nt = time.time()\nwhile time.time() - t < 0.8: pass\n"
    subprocess.run([sys.executable, "-c", spin], check=True)
    foreign = meter.stop()
    # One spinning process is one core's worth of somebody else's work.
    assert foreign is not None and foreign >= 0.5 / (os.cpu_count() or 1)


def test_own_work_is_not_counted_and_short_spans_say_nothing():
    meter = CpuMeter()
    meter.start()
    assert meter.stop() is None  # far shorter than a /proc/stat tick can resolve
    meter.start()
    t = time.perf_counter()
    while time.perf_counter() - t < MIN_WALL_S + 0.2:
        pass  # our own busy loop
    foreign = meter.stop()
    assert foreign is not None and 0.0 <= foreign <= 1.0
