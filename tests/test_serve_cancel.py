"""Abandoned and slow requests (issue #52): a client that hangs up stops its generation,
whether mid-stream or mid-prompt, however the cancel races the order to the engine
process; and a compute thread that dies or hangs is the engine-lost path (500 for the
request it held, 503 while restarting, then served again), never a silent hang.

Real servers on 127.0.0.1, real engine processes, tiny real GGUF models; the only
fault injected is a model whose llama_decode never returns (HangingModel)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from servers import AppOnThread, ServerProcess
from tinymodels import write_tiny_model

from specllama import SamplingParams, SpeculativeDecoder
from specllama.engine.llama import Model, Vocabulary
from specllama.engine.llama.batched import Batcher, ComputeLost, SeqView
from specllama.engine.loop.events import PromptProgress
from specllama.server import Defaults, ServeConfig
from specllama.server.app import create_app
from specllama.server.isolation import EngineProcess
from specllama.server.jobs import Order, Slot
from specllama.server.pipe import Cancel
from specllama.server.promptcache import PromptCache
from specllama.server.prompts import Work
from specllama.server.slots import Slots
from specllama.server.worker import Worker

PROMPT = "the cat and the dog"
LONG = "the cat and the dog " * 600  # ~3,000 tokens: six steps of 512
MAX = 3000  # far more than a tiny model writes before a cancel arrives
GREEDY = SamplingParams(temperature=0.0)
DRAFTERS = ("lookup", "model")


def wait_for(check, timeout: float = 60.0, every: float = 0.05):
    """check()'s first truthy value; generous: the machine may be loaded."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            assert value, "timed out"
            return value
        time.sleep(every)


def health(url: str) -> httpx.Response:
    return httpx.get(f"{url}/health", timeout=10)


def complete(url: str, model: str, prompt: str = PROMPT, max_tokens: int = 8) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=120, json={
        "model": model, "prompt": prompt, "temperature": 0, "max_tokens": max_tokens})


def order(i: int, tokens: list[int], max_tokens: int = MAX, events="text") -> Order:
    return Order(i, Work("completion", list(tokens), max_tokens, GREEDY, ()), events, 3,
                 DRAFTERS)


# ------------------------------------------------- a client that leaves mid-stream


@pytest.mark.parametrize("parallel", [1, 3])
def test_streams_dropped_after_their_first_chunk_stop_and_the_next_is_served(
        tiny_target, tiny_draft, tmp_path, parallel):
    """Six streams of up to 3,000 tokens, each closed by its client after its first
    chunk: each stops (none runs on to max_tokens), none is counted completed, the
    engine is idle again and the next request is served at once."""
    server = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                            "--n-ctx", 4096, "--draft-max", 3, "--parallel", parallel],
                           tmp_path)
    try:
        def abandon(i: int) -> None:
            with httpx.stream("POST", f"{server.url}/v1/completions", timeout=120, json={
                "model": server.model, "prompt": f"{PROMPT} {i}", "temperature": 0,
                "max_tokens": MAX, "stream": True,
            }) as r:
                assert r.status_code == 200
                next(line for line in r.iter_lines() if line.startswith("data: "))

        clients = [threading.Thread(target=abandon, args=(i,)) for i in range(6)]
        for c in clients:
            c.start()
        for c in clients:
            c.join(120)
        h = wait_for(lambda: (b := health(server.url).json())["requests"]["cancelled"] == 6
                     and not b["busy"] and b)
        assert h["serving"] == 0 and h["waiting"] == 0
        assert h["requests"]["completed"] == 0 and h["requests"]["failed"] == 0
        # Each stopped: together they wrote less than one would have alone.
        assert h["requests"]["tokens"] < MAX, h

        r = complete(server.url, server.model)
        assert r.status_code == 200
        h = health(server.url).json()
        assert h["requests"]["completed"] == 1 and h["requests"]["cancelled"] == 6
        assert h["cache"]["consistent"]
        assert "Traceback" not in server.stderr
    finally:
        server.kill()


# ----------------------------------------------------- a client that leaves mid-prompt


@pytest.fixture(scope="module")
def slow_target(tmp_path_factory) -> Path:
    """A tiny model wide enough that a 3,000-token prompt takes seconds on one thread."""
    return write_tiny_model(tmp_path_factory.mktemp("slow") / "slow.gguf", seed=0,
                            n_embd=512, n_layer=6, n_ff=2048, n_head=8, n_head_kv=8)


def test_a_client_gone_during_a_long_prompt_frees_the_engine_within_a_step(
        slow_target, tmp_path):
    """The client hangs up while its ~3,000-token prompt is evaluated: the engine stops
    at the next step of 512 tokens, so the prompt is never all in the cache, and the next
    request is served."""
    server = ServerProcess(["--target", slow_target, "--threads", 1, "--n-ctx", 4096,
                            "--cache-mib", 0], tmp_path)
    try:
        host, port = server.url.removeprefix("http://").split(":")
        body = json.dumps({"model": server.model, "prompt": LONG, "temperature": 0,
                           "max_tokens": 4, "stream": True}).encode()
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\n"
                         + f"Host: {host}:{port}\r\n".encode()
                         + b"Content-Type: application/json\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            wait_for(lambda: health(server.url).json()["serving"] == 1)
        h = wait_for(lambda: (b := health(server.url).json())["requests"]["cancelled"] == 1
                     and not b["busy"] and b)
        n_prompt = len(Vocabulary(slow_target).tokenize(LONG))
        cache = h["cache"]
        assert cache["target"] < n_prompt - 1, cache  # the prompt was not all evaluated
        assert cache["history"] == n_prompt and cache["consistent"], cache
        r = complete(server.url, server.model)
        assert r.status_code == 200
        assert health(server.url).json()["requests"]["completed"] == 1
    finally:
        server.kill()


def test_a_long_prompt_goes_in_steps_that_a_cancel_stops_between(tiny_target, tiny_draft):
    """In the engine: a PromptProgress between steps of n_batch; a cancel at the first
    one stops the prompt there, and the caches stay consistent for the next request."""
    decoder = SpeculativeDecoder(Model(tiny_target, n_ctx=4096, n_threads=1),
                                 Model(tiny_draft, n_ctx=4096, n_threads=1))
    try:
        engine = Slot(decoder)
        tokens = decoder.tokenize(LONG)
        seen: list[object] = []
        outcome = engine.run(order(1, tokens, 8, "all"), seen.append,
                             lambda: any(isinstance(e, PromptProgress) for e in seen))
        step = decoder.target.n_batch
        # Read before each event is handed over: the second step's end is where it stops.
        assert [e for e in seen if isinstance(e, PromptProgress)] == [
            PromptProgress(step, len(tokens))]
        assert outcome.result is None  # stopped before its first round
        assert len(decoder.target.cached) == 2 * step < len(tokens) - 1
        assert outcome.cache["consistent"]
        assert engine.run(order(2, tokens, 8), lambda e: None, lambda: False).failure is None
    finally:
        decoder.close()


def test_prompts_in_steps_give_what_one_decode_gave(tiny_target, tiny_draft):
    """Greedy output is the same token for token with the prompt in steps (now), in one
    decode call (before), and on a slot of a parallel engine (steps of its base's
    n_batch, each cut into pieces there)."""
    tokens_prompt = "once upon a time " * 300 + "there"

    def alone(step: int | None) -> list[int]:
        decoder = SpeculativeDecoder(Model(tiny_target, n_ctx=4096, n_threads=1),
                                     Model(tiny_draft, n_ctx=4096, n_threads=1))
        try:
            if step is not None:
                decoder.target.prompt_step = step
            return decoder.generate(tokens_prompt, max_tokens=64, sampling=GREEDY,
                                    draft_max=3).tokens
        finally:
            decoder.close()

    stepped = alone(None)
    assert stepped == alone(1 << 20)
    decoder = SpeculativeDecoder(Model(tiny_target, n_ctx=4096, n_threads=1, n_seq=2),
                                 Model(tiny_draft, n_ctx=4096, n_threads=1, n_seq=2))
    slots = Slots(decoder)
    try:
        slots.prepare()
        tokens = decoder.tokenize(tokens_prompt)
        outcome = slots.run(order(1, tokens, 64), lambda e: None, lambda: False)
        assert outcome.result is not None and outcome.result.tokens == stepped
    finally:
        slots.close()


def test_a_slot_setting_up_holds_no_other_slot_back(tiny_target, tiny_draft, monkeypatch):
    """`--parallel 2`: while one request sets up (here its prompt-cache step is held, as
    a grammar compile or llguidance's tokenizer build would hold it), the other keeps
    generating: a batch does not wait for the share of a request that is not decoding."""
    decoder = SpeculativeDecoder(Model(tiny_target, n_ctx=1024, n_threads=1, n_seq=2),
                                 Model(tiny_draft, n_ctx=1024, n_threads=1, n_seq=2))
    slots = Slots(decoder)
    first: list[object] = []
    moved = threading.Event()
    prepare = PromptCache.prepare

    def slow_setup(self, prompt, target, draft, **kw):
        if prompt == b_tokens:  # the second request's setup waits for the first to move
            seen = len(first)
            wait_for(lambda: len(first) >= seen + 10 or a.done(), 20)
            moved.set()
        return prepare(self, prompt, target, draft, **kw)

    monkeypatch.setattr(PromptCache, "prepare", slow_setup)
    try:
        slots.prepare()
        a_tokens, b_tokens = (decoder.tokenize(p) for p in (PROMPT, "once upon a time"))
        with ThreadPoolExecutor(2) as pool:
            a = pool.submit(slots.run, order(1, a_tokens, 800), first.append, lambda: False)
            wait_for(lambda: first)
            b = pool.submit(slots.run, order(2, b_tokens, 8), lambda e: None, lambda: False)
            assert a.result(120).failure is None and b.result(120).failure is None
        assert moved.is_set()
    finally:
        slots.close()


# ------------------------------------- the cancel and the order racing to the engine


def load_tiny(target: str, draft: str | None, n_seq: int, hang_once: str | None,
              first: bool):
    """An engine process's Factory (pickled by reference): the tiny pair; with
    `hang_once`, a target whose batch decodes hang once that file exists."""
    model = Model if hang_once is None else functools.partial(HangingModel, hang_once)
    decoder = SpeculativeDecoder(model(target, n_ctx=4096, n_threads=1, n_seq=n_seq),
                                 None if draft is None else
                                 Model(draft, n_ctx=4096, n_threads=1, n_seq=n_seq))
    return decoder, lambda: None, None


class HangingModel(Model):
    """A real tiny model whose next llama_decode never returns once `trigger` exists
    (taken by renaming it: the engine started again finds none)."""

    def __init__(self, trigger: str, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.trigger = trigger

    def submit(self, batch) -> int:
        try:
            os.rename(self.trigger, self.trigger + ".taken")
        except FileNotFoundError:
            return super().submit(batch)
        threading.Event().wait()  # a llama_decode stuck for good
        raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def engine_process(tiny_target, tiny_draft):
    engine = EngineProcess(functools.partial(load_tiny, str(tiny_target), str(tiny_draft),
                                             1, None))
    engine.start()
    yield engine, Vocabulary(tiny_target).tokenize(PROMPT)
    engine.close()


ids = itertools.count(1)


def test_a_cancel_told_only_by_the_flag_stops_the_order(engine_process):
    """The client left after the first event, and nobody called cancel() (the worker's
    gap between its check and Job.on_cancel): run reads `cancelled` itself."""
    engine, tokens = engine_process
    seen: list[object] = []
    outcome = engine.run(order(next(ids), tokens), seen.append, lambda: bool(seen))
    assert outcome.result is not None and outcome.result.finish_reason == "interrupted"
    assert outcome.result.stats.tokens < MAX


def test_an_order_cancelled_before_it_is_sent_never_runs(engine_process):
    engine, tokens = engine_process
    seen: list[object] = []
    assert engine.run(order(next(ids), tokens), seen.append, lambda: True).result is None
    assert seen == []


def test_a_cancel_that_reaches_the_child_before_its_order_is_kept(engine_process):
    engine, tokens = engine_process
    i = next(ids)
    engine._link.send(Cancel(i))  # what a reordering would do
    outcome = engine.run(order(i, tokens), lambda e: None, lambda: False)
    assert outcome.result is None  # cancelled as it arrived: never began
    after = engine.run(order(next(ids), tokens, 8), lambda e: None, lambda: False)
    assert after.result is not None and after.result.finish_reason == "length"


# ------------------------------------------------- a compute thread dead or hung


@pytest.fixture
def batcher(tiny_target, monkeypatch):
    """A Batcher over the tiny target with two sequences; hung after 1 s of one job."""
    monkeypatch.setenv("SPECLLAMA_COMPUTE_TIMEOUT", "1")
    base = Model(tiny_target, n_ctx=512, n_threads=1, n_seq=2)
    told: list[str] = []
    batcher = Batcher(base, told.append)
    yield batcher, SeqView(batcher, 0), told
    batcher.close()
    base.close()


def test_a_decode_waiting_on_a_hung_compute_thread_raises(batcher):
    batcher, view, told = batcher
    release = threading.Event()

    def hold() -> None:  # (its own caller may be told too, or see it return)
        with contextlib.suppress(ComputeLost):
            batcher.call(lambda: release.wait(60))

    stuck = threading.Thread(target=hold)
    stuck.start()
    try:
        wait_for(lambda: batcher._busy_since is not None)
        with batcher.active(0), pytest.raises(ComputeLost, match="has not returned for 1 s"):
            view.decode([1, 5, 6])
        assert told and "has not returned" in told[0]
    finally:
        release.set()
        stuck.join(30)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_decode_waiting_on_a_dead_compute_thread_raises(batcher):
    batcher, view, told = batcher
    thread = batcher._thread

    class Killed(BaseException):
        pass

    # Raised in the compute thread where it waits for work: it ends, as a defect would.
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                               ctypes.py_object(Killed))
    with batcher.active(0), pytest.raises(ComputeLost, match="compute thread died"):
        view.decode([1, 5, 6])  # wakes it: it dies, and this decode must not wait for ever
    assert not thread.is_alive()
    assert told == ["the engine's compute thread died"]


class InProcessServer:
    """The HTTP side in this process (uvicorn on a thread), its engine a real engine
    process made by `factory`."""

    def __init__(self, factory, vocab: Vocabulary, parallel: int,
                 engine=EngineProcess) -> None:
        self.model = "tiny"
        self.engine = engine(factory, 0)
        self.engine.start()
        self.log: list[str] = []
        assert self.engine.parallel == parallel  # as the models were loaded
        self.worker = Worker(self.engine, max_waiting=4, draft_max=3, drafters=("lookup",),
                             log=self.log.append)
        config = ServeConfig(self.model, Defaults(GREEDY, 8), draft_max=3,
                             drafters=("lookup",), n_ctx=4096, parallel=parallel)
        app = create_app(self.worker, config, vocab, self.log.append)
        self.worker.start()
        self.http = AppOnThread(app)
        self.url = self.http.url

    def stop(self) -> None:
        self.http.stop()
        self.worker.close()


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_hung_compute_thread_is_the_engine_lost_path(tiny_target, tmp_path, monkeypatch,
                                                       parallel):
    """A llama_decode hangs: on the compute thread (`--parallel 2`) or on the one slot's
    (`--parallel 1`, where the engine process watches its decodes). The request it held
    fails with a 500 naming the hang (not a hang of its own), /health says unavailable
    while the engine is started again, and the next request is served as before."""
    monkeypatch.setenv("SPECLLAMA_COMPUTE_TIMEOUT", "2")  # read in the engine process
    trigger = tmp_path / "hang"
    server = InProcessServer(functools.partial(load_tiny, str(tiny_target), None, parallel,
                                               str(trigger)), Vocabulary(tiny_target), parallel)
    try:
        expected = complete(server.url, server.model).json()["choices"][0]["text"]
        pid = health(server.url).json()["engine_pid"]
        trigger.touch()
        r = complete(server.url, server.model)
        assert r.status_code == 500, r.text
        assert "has not returned for 2 s" in r.json()["error"]["message"]
        h = wait_for(lambda: (r := health(server.url)).status_code == 200 and r.json())
        assert h["engine_pid"] != pid and h["requests"]["engine_restarts"] == 1
        r = complete(server.url, server.model)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected
    finally:
        server.stop()


class LateEngine(EngineProcess):
    """Returns from each order half a second after its answer went out: by then the
    HTTP side has sent it and cancelled the (ended) job."""

    def run(self, *args):
        outcome = super().run(*args)
        time.sleep(0.5)
        return outcome


def test_a_request_answered_before_it_is_counted_counts_as_completed(tiny_target):
    """/health counted a request whose answer had gone out as cancelled when the server
    closed the job before the worker counted it (a race in CI's 8-client load test)."""
    server = InProcessServer(functools.partial(load_tiny, str(tiny_target), None, 1, None),
                             Vocabulary(tiny_target), 1, engine=LateEngine)
    try:
        assert complete(server.url, server.model).status_code == 200
        with httpx.stream("POST", f"{server.url}/v1/completions", timeout=120, json={
                "model": server.model, "prompt": PROMPT, "max_tokens": 8,
                "stream": True}) as r:
            assert r.status_code == 200
            # As the openai client does: read up to [DONE], then hang up.
            assert "data: [DONE]" in r.iter_lines()
        h = wait_for(lambda: (h := health(server.url).json()) and not h["busy"] and h)
        assert (h["requests"]["completed"], h["requests"]["cancelled"]) == (2, 0)
    finally:
        server.stop()


def load_listing_cli(target: str, first: bool):
    """An engine process's Factory: the pair as `serve` loads it (loading.serve_engine),
    telling which command-line modules the process holds."""
    import sys

    from specllama.loading import RunOptions, serve_engine

    decoder, measure, _ = serve_engine(RunOptions(target=target, flags=(
        ("threads", 1), ("n_ctx", 256))), first)
    return decoder, measure, sorted(m for m in sys.modules if m.startswith("specllama.cli"))


def test_the_engine_process_runs_no_command_line_code(tiny_target, tmp_path, monkeypatch):
    """Started from the `specllama` script, spawn would run that script again in the
    child, and with it all of cli/: the engine process loads the pair without it."""
    import sys
    import types

    script = tmp_path / "specllama"
    script.write_text("from specllama.cli import main\n")
    console_script = types.ModuleType("__main__")
    console_script.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", console_script)
    engine = EngineProcess(functools.partial(load_listing_cli, str(tiny_target)))
    try:
        assert engine.start() == []
        assert console_script.__file__ == str(script)  # the parent's main is as it was
    finally:
        engine.close()
