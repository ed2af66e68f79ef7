"""What the repository holds: sources and documentation, not build outputs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Names that only a build or an install writes.
ARTEFACT_SUFFIXES = (".whl", ".egg", ".so", ".pyd", ".dll", ".dylib", ".exe", ".o", ".a",
                     ".pyc", ".pyo")
# Openings of archives and compiled programs, whatever the file is named: ELF, Mach-O,
# Windows PE, zip (a wheel or egg is a zip).
ARTEFACT_MAGIC = (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"MZ", b"PK\x03\x04")


def tracked_files(root: Path) -> list[str]:
    """The files git tracks under `root`; skips the test outside a git checkout."""
    if shutil.which("git") is None:
        pytest.skip("reads what git tracks, and git is not installed: apt-get install git")
    done = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True)
    if done.returncode != 0:
        pytest.skip("reads what git tracks: runs in a git clone, not in an unpacked archive")
    return [name for name in done.stdout.decode().split("\0") if name]


def build_artefacts(root: Path) -> list[str]:
    """Tracked files that are wheels, eggs, compiled code or bytecode, by name or content."""
    found = []
    for name in tracked_files(root):
        path = root / name
        if name.lower().endswith(ARTEFACT_SUFFIXES):
            found.append(name)
        elif path.is_file() and not path.is_symlink():
            with path.open("rb") as f:
                if f.read(4).startswith(ARTEFACT_MAGIC):
                    found.append(name)
    return found


def test_no_build_artefact_is_tracked():
    assert build_artefacts(ROOT) == [], "build outputs belong in .gitignore, not in git"


def test_wheels_are_ignored():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("asks git what it ignores: runs in a git clone, with git installed")
    done = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "dist-x/any-1.0.whl"])
    assert done.returncode == 0, ".gitignore should ignore *.whl"
