"""llama.cpp as a process-wide resource, beside `llama.py`'s one model at a time.

Its log (a ring of recent lines that explains load failures), its one start, what the
build holds (AMX kernels, the RPC backend), the ctypes bindings llama-cpp-python lacks
(a fast logits address; ggml's RPC devices and server), and how the process ends in one
line where llama.cpp would abort or a remote decode would hang. With `llama.py`, the
only module that imports llama_cpp.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ...errors import ModelLoadError, RpcError
from . import rpc as rpc_net

try:
    import llama_cpp as lc
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ModelLoadError(
        f"llama-cpp-python is not installed or failed to import ({exc}); "
        "install it with: pip install 'llama-cpp-python>=0.3.36,<0.4'"
    ) from exc

# ------------------------------------------------------------------ log and start
# llama.cpp's log goes into this ring instead of the terminal; the last lines
# explain load failures. SPECLLAMA_DEBUG=1 echoes it to stderr.
_LOG: deque[str] = deque(maxlen=1024)


@lc.llama_log_callback
def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", errors="replace")
    _LOG.append(line)
    if os.environ.get("SPECLLAMA_DEBUG"):
        sys.stderr.write(line)


@functools.cache
def init() -> None:
    """Route llama.cpp's log to our ring and start its backend: once, when the first
    model is loaded, quantized or served (not merely because this module was imported)."""
    lc.llama_log_set(_on_log, ctypes.c_void_p(0))
    lc.llama_backend_init()


def recent_log() -> list[str]:
    """llama.cpp's latest log lines (what a context just allocated, for bench/hybrid.py)."""
    return list(_LOG)


def last_log_error() -> str:
    """The latest error line of llama.cpp's log, else its latest line."""
    for line in reversed(_LOG):
        line = line.strip()
        if line and ("error" in line.lower() or "failed" in line.lower()):
            return line
    return next((line.strip() for line in reversed(_LOG) if line.strip()), "no details")


@functools.cache
def amx_built_in() -> bool:
    """Whether this llama.cpp was compiled with its AMX kernels (-march=native on a CPU
    with AMX). Built by GCC 12 they crash on every batch of 2 or more quantized tokens
    (the compiler drops the stores that fill the tile configuration; llama.cpp issue
    20824), so such a build loads models without extra buffer types, AMX's kind
    (docs/lab/2026-12-local-generation.md, "A crash on this CPU, fixed")."""
    info = lc.llama_print_system_info().decode("utf-8", errors="replace")
    return "AMX_INT8 = 1" in info


LogitsAddress = Callable[[int | None, int], int | None]


@functools.cache
def logits_address() -> LogitsAddress | None:
    """llama_get_logits_ith returning a plain address. The row is read right after
    a decode has flushed the CPU caches, where llama-cpp-python's POINTER(c_float)
    result plus numpy.ctypeslib costs ~100 us a token; this is a few. Indexing the
    library gives a new function object (not the one llama-cpp-python uses), so
    retyping it changes nothing for anyone else."""
    try:
        fn = lc.llama_cpp._lib["llama_get_logits_ith"]
    except (AttributeError, KeyError, TypeError, OSError):  # pragma: no cover
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    fn.restype = ctypes.c_void_p
    return fn


# ------------------------------------------------------------------ RPC devices
# ggml's RPC backend (ggml-rpc.h, ggml-backend.h of the bundled llama.cpp), reached
# through the registry the way llama.cpp's own tools do, so a build without it is a
# clear error rather than a missing symbol.
RPC_BUILD_HINT = (
    "this llama-cpp-python was built without llama.cpp's RPC backend; rebuild it with: "
    'CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir '
    "'llama-cpp-python>=0.3.36,<0.4'"
)
_VP = ctypes.c_void_p
_GGML_DEVICE_CPU = 0  # enum ggml_backend_dev_type


@functools.cache
def _ggml() -> ctypes.CDLL:
    """libggml (the backend registry) next to llama-cpp-python's libllama."""
    lib_dir = Path(lc.llama_cpp.__file__).parent / "lib"
    names = ("libggml.so", "libggml.dylib", "ggml.dll")
    path = next((lib_dir / n for n in names if (lib_dir / n).exists()), None)
    if path is None:  # pragma: no cover - depends on the install
        raise RpcError(f"libggml not found in {lib_dir}; {RPC_BUILD_HINT}")
    lib = ctypes.CDLL(str(path))
    for name, res, args in (
        ("ggml_backend_reg_by_name", _VP, [ctypes.c_char_p]),
        ("ggml_backend_reg_get_proc_address", _VP, [_VP, ctypes.c_char_p]),
        ("ggml_backend_reg_dev_count", ctypes.c_size_t, [_VP]),
        ("ggml_backend_reg_dev_get", _VP, [_VP, ctypes.c_size_t]),
        ("ggml_backend_dev_by_type", _VP, [ctypes.c_int]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def _rpc_proc(name: str, prototype: Any) -> Any:
    ggml = _ggml()
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    address = ggml.ggml_backend_reg_get_proc_address(reg, name.encode()) if reg else None
    if not address:
        raise RpcError(RPC_BUILD_HINT)
    return prototype(address)


_RPC_SEEN: set[str] = set()  # endpoints ggml has connected to in this process
_ADD_SERVER = ctypes.CFUNCTYPE(_VP, ctypes.c_char_p)
_START_SERVER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                 ctypes.c_size_t, ctypes.POINTER(_VP))
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


def rpc_available() -> bool:
    """Whether this llama.cpp build has the RPC backend."""
    try:
        _rpc_proc("ggml_backend_rpc_add_server", _ADD_SERVER)
    except RpcError:
        return False
    return True


def rpc_devices(endpoints: Sequence[str]) -> Any:
    """The devices of these RPC servers as llama_model_params.devices takes them (a
    NULL-terminated ctypes array), each server checked first (bounded) because ggml's
    client would abort the process on one it cannot reach."""
    add_server = _rpc_proc("ggml_backend_rpc_add_server", _ADD_SERVER)
    ggml = _ggml()
    devices: list[int] = []
    for endpoint in endpoints:
        if endpoint not in _RPC_SEEN:
            # Not again once connected: ggml keeps that connection, and the server,
            # serving one client at a time, would not answer a second one.
            rpc_net.check_server(endpoint)
        reg = add_server(endpoint.encode())
        _RPC_SEEN.add(endpoint)
        count = ggml.ggml_backend_reg_dev_count(reg) if reg else 0
        if not count:
            raise RpcError(f"RPC server {endpoint} offers no devices")
        devices.extend(ggml.ggml_backend_reg_dev_get(reg, i) for i in range(count))
    _install_abort_handler()
    _start_stall_watch()
    return (_VP * (len(devices) + 1))(*devices, None)


def serve_rpc(host: str, port: int, *, n_threads: int, cache_dir: Path | None) -> None:
    """Run ggml's RPC server on this machine's CPU; returns only if it cannot start."""
    init()
    start = _rpc_proc("ggml_backend_rpc_start_server", _START_SERVER)
    cpu = _ggml().ggml_backend_dev_by_type(_GGML_DEVICE_CPU)
    if not cpu:  # pragma: no cover - every build has a CPU backend
        raise RpcError("llama.cpp found no CPU device to serve")
    devices = (_VP * 1)(cpu)
    cache = str(cache_dir).encode() if cache_dir is not None else None
    start(f"{host}:{port}".encode(), cache, n_threads, 1, devices)


# ------------------------------------------------------ ending in one line, not a hang
_LAST_WORDS: list[Callable[[str, bool], None]] = []


def on_fatal(sink: Callable[[str, bool], None]) -> None:
    """Hand the last words to `sink(message, remote)` instead of stderr: an engine
    process tells its supervisor why it ends (remote: the RPC server was lost)."""
    _LAST_WORDS[:] = [sink]


def _fatal(message: str, remote: bool = False) -> None:
    """Last words when llama.cpp aborts: it calls abort() right after this, so
    the process cannot go on; leave with one line and exit code 2 instead."""
    try:
        if _LAST_WORDS:
            _LAST_WORDS[0](message, remote)
        else:
            if remote and message.startswith("lost"):
                message += "; the target lives there, so generation cannot go on"
            os.write(2, f"specllama: error: {message}\n".encode(errors="replace"))
    finally:
        os._exit(2)


def _stall_bound(default: float = 120.0) -> float:
    """Seconds one decode on RPC devices may take before the server counts as lost: a
    server that stops answering but keeps its connection would otherwise hang us."""
    try:
        value = float(os.environ.get("SPECLLAMA_RPC_TIMEOUT", "") or default)
    except ValueError:
        return default
    return value if value > 0 else default


RPC_STALL_S = _stall_bound()
# A decode under way -> (deadline, the last words past it, whether the RPC server is why).
_WAITS: dict[object, tuple[float, str, bool]] = {}
_LOCAL_BOUND: list[float] = []  # set in an engine process (watch_local_decodes)


@contextlib.contextmanager
def _watched(deadline: float, message: str, remote: bool) -> Iterator[None]:
    key = object()
    _WAITS[key] = (deadline, message, remote)
    try:
        yield
    finally:
        del _WAITS[key]


def stall_watch(where: str) -> contextlib.AbstractContextManager[None]:
    """Around one decode on the RPC servers `where`: past RPC_STALL_S, the process ends."""
    return _watched(time.monotonic() + RPC_STALL_S,
                    f"the RPC server {where} has not answered for {RPC_STALL_S:g} s; giving "
                    "up (SPECLLAMA_RPC_TIMEOUT sets this bound)", True)


def watch_local_decodes(bound_s: float) -> None:
    """In an engine process: a local decode that has not returned after `bound_s` ends
    the process, so its supervisor starts another (with one slot no compute thread
    watches the decodes: batched.py)."""
    _LOCAL_BOUND[:] = [bound_s]
    _start_stall_watch()


def local_watch() -> contextlib.AbstractContextManager[None]:
    """Around one local decode: watched once `watch_local_decodes` was called."""
    if not _LOCAL_BOUND:
        return contextlib.nullcontext()
    bound = _LOCAL_BOUND[0]
    return _watched(time.monotonic() + bound,
                    f"a decode has not returned for {bound:g} s: the engine hangs "
                    "(SPECLLAMA_COMPUTE_TIMEOUT sets this bound)", False)


@functools.cache
def _start_stall_watch() -> None:
    """One daemon thread: a decode past its deadline ends the process in one line (the
    C call cannot be interrupted, and its state would be unknown anyway)."""

    def watch() -> None:
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            for deadline, message, remote in list(_WAITS.values()):
                if now > deadline:
                    _fatal(message, remote=remote)

    threading.Thread(target=watch, name="specllama-decode-watch", daemon=True).start()


_ABORT_HANDLER: list[Any] = []  # keeps the ctypes callback alive for the process's life


@functools.cache
def _install_abort_handler() -> None:
    """A lost RPC server makes ggml abort (GGML_ABORT in its client thread), with a
    C backtrace; say it in one line instead. Installed only once a remote device is
    used, so local runs keep llama.cpp's own behaviour."""

    def on_abort(raw: bytes | None) -> None:
        text = (raw or b"").decode("utf-8", errors="replace").strip()
        text = text.split(": ", 1)[-1] if text.count(":") >= 2 else text  # drop file:line
        if "RPC" in text or "connect" in text:
            _fatal(f"lost the RPC server {', '.join(sorted(_RPC_SEEN))} ({text.rstrip('.')})",
                   remote=True)
        _fatal(f"llama.cpp aborted: {text}")

    _ABORT_HANDLER.append(_ABORT_CALLBACK(on_abort))
    # libllama links libggml-base, which holds the setter
    fn = lc.llama_cpp._lib["ggml_set_abort_callback"]
    fn.restype, fn.argtypes = _VP, [_ABORT_CALLBACK]
    fn(_ABORT_HANDLER[0])
