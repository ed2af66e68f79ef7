"""Compiled modules for the test run's many Python processes, kept in a temporary directory.

Where PYTHONDONTWRITEBYTECODE is set (CI's image sets it), every `specllama` the tests start
(a server and its engine process, a CLI run, a REPL in a terminal) compiled the package from
its sources again, and each pytest worker rewrote every test module again: ~0.35 s a process
on a 2-core AMD EPYC. The tests write only under the temporary directory, so the bytecode
goes there (PYTHONPYCACHEPREFIX), never next to the sources. Imported first by conftest.py,
before the package is, and inherited by every process the tests start.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

if sys.dont_write_bytecode and not os.environ.get("PYTHONPYCACHEPREFIX"):
    prefix = Path(tempfile.gettempdir()) / f"specllama-tests-pycache-{os.getuid()}"
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix = str(prefix)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
