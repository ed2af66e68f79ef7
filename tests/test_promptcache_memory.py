"""The prompt cache's memory: copies sized before they are made (never one that cannot
fit, room made first), a limit the machine cannot give refused, and a copy llama.cpp
will not take back under `serve --parallel` answered by a fresh decode, not a 500."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from click.testing import CliRunner
from drafts import GREEDY
from servers import AppOnThread
from test_cli import assert_one_line_error

from specllama import SamplingParams, SpeculativeDecoder
from specllama.cli import cli
from specllama.engine.llama import KVState, Model
from specllama.engine.llama.batched import SeqView
from specllama.server import Defaults, ServeConfig, promptcache
from specllama.server.app import create_app
from specllama.server.jobs import Order, Slot
from specllama.server.prompts import Work
from specllama.server.slots import Slots
from specllama.server.worker import Worker

WORDS = "the cat sat on a mat and the dog ran to the red ball while a bird sang".split()


def text(seed: int, n_words: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, n_words))


@pytest.fixture
def decoder(tiny_target, tiny_draft):
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=512, n_threads=1)
    yield dec
    dec.close()


def run(engine: Slot, tokens: list[int], max_tokens: int = 1) -> None:
    work = Work("completion", tokens, max_tokens, GREEDY, ())
    outcome = engine.run(Order(1, work, "end", 3, ("lookup", "model")), lambda e: None,
                         lambda: False)
    assert outcome.failure is None, outcome.failure


def spy_copies(decoder: SpeculativeDecoder, cache: promptcache.PromptCache,
               monkeypatch) -> list[tuple[int, int]]:
    """Each copy the cache takes: (the bytes it held when the copy began, the copy's bytes,
    both models'). The real save_state runs; only its calls are recorded."""
    copies: list[tuple[int, int]] = []
    for name in ("target", "draft"):
        model = getattr(decoder, name)
        save = model.save_state

        def recording(save=save, name=name) -> KVState:
            state = save()
            if name == "target":
                copies.append((cache.figures().bytes, len(state.data)))
            else:
                held, size = copies[-1]
                copies[-1] = (held, size + len(state.data))
            return state

        monkeypatch.setattr(model, "save_state", recording)
    return copies


# -------------------------------------------------------------- sized before copying


def test_a_states_size_is_known_before_it_is_copied(decoder, tiny_target):
    """What the cache counts a copy as, before making it, is the copy's exact size: for a
    model alone and for one sequence of a context several share."""
    decoder.target.decode(decoder.tokenize(text(1, 100)), "none")
    for model in (decoder.target, decoder.draft):
        assert promptcache.state_size(model) == len(model.save_state().data) > 0
    shared = Model(tiny_target, n_ctx=256, n_threads=1, n_seq=2)
    slots = Slots(SpeculativeDecoder(shared))
    try:
        slots.prepare()
        view = slots.slots[1].decoder.target
        assert isinstance(view, SeqView)
        assert slots.batcher is not None
        with slots.batcher.active(1):
            view.decode(decoder.tokenize(text(2, 50)), "none")
        assert promptcache.state_size(view) == len(view.save_state().data) > 0
    finally:
        slots.close()


def test_a_copy_that_cannot_fit_is_never_made(decoder, monkeypatch):
    """A limit below one copy: the live caches are never copied (and dropped at once)."""
    run(Slot(decoder), decoder.tokenize(text(3, 150)))
    one = len(decoder.target.save_state().data) + len(decoder.draft.save_state().data)
    cache = promptcache.PromptCache(one // 2)
    engine = Slot(decoder, prompt_cache=cache)
    copies = spy_copies(decoder, cache, monkeypatch)
    for seed in (4, 5, 6):
        run(engine, decoder.tokenize(text(seed, 150)))
    assert copies == []
    assert cache.figures().entries == 0 and cache.figures().bytes == 0


def test_room_is_made_before_a_copy_so_the_copies_never_pass_the_limit(decoder,
                                                                        monkeypatch):
    """Room for two and a half copies: the third evicts the least recently used first, so
    the copies held while it is taken, and it, stay within the limit."""
    prompts = [decoder.tokenize(text(10 + i, 120)) for i in range(5)]
    run(Slot(decoder), prompts[0])
    one = len(decoder.target.save_state().data) + len(decoder.draft.save_state().data)
    limit = int(2.5 * one)
    cache = promptcache.PromptCache(limit)
    engine = Slot(decoder, prompt_cache=cache)
    copies = spy_copies(decoder, cache, monkeypatch)
    for p in prompts:
        run(engine, p)
    assert len(copies) == len(prompts) - 1  # each prompt's caches, as the next came
    for held, size in copies:
        assert held + size <= limit, (held, size, limit)
    assert cache.figures().entries == 2 and cache.figures().bytes <= limit


# ---------------------------------------------------------------- --cache-mib


def test_a_cache_larger_than_the_machine_has_is_a_one_line_error():
    result = CliRunner().invoke(cli, ["serve", "--port", "0", "--cache-mib", str(1 << 20),
                                      "--target", "x.gguf", "--draft", "lookup"])
    assert_one_line_error(result, "--cache-mib", "1048576 MiB is more than this machine has "
                                                 "available")


def test_the_memory_a_limit_is_checked_against():
    have = promptcache.available_memory()
    assert have is not None and 0 < have < 1 << 40  # (a Linux machine, under 1 TiB)
    assert promptcache.beyond_memory(64 << 20) is None
    assert promptcache.beyond_memory(have + (1 << 20)) is not None


# --------------------------------------------- a copy llama.cpp will not take back


class ParallelServer:
    """The API on 127.0.0.1 from this process, over `serve --parallel 2`'s slots with a
    prompt cache (what `specllama serve` runs in its engine process, in one process)."""

    def __init__(self, target, draft, cache_bytes: int) -> None:
        models = [Model(path, n_ctx=512, n_threads=1, n_seq=2) for path in (target, draft)]
        self.slots = Slots(SpeculativeDecoder(*models), cache_bytes=cache_bytes)
        self.worker = Worker(self.slots, max_waiting=8, draft_max=3,
                             drafters=("lookup", "model"))
        config = ServeConfig("tiny", Defaults(SamplingParams(temperature=0.0), 8),
                             draft_max=3, drafters=("lookup", "model"), n_ctx=512,
                             parallel=2)
        app = create_app(self.worker, config, models[0], lambda line: None)
        self.worker.start()
        self.http = AppOnThread(app)
        self.url = self.http.url

    def complete(self, prompt: str) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/completions", timeout=60,
                          json={"model": "tiny", "prompt": prompt, "max_tokens": 16})

    def stop(self) -> None:
        self.http.stop()
        self.worker.close()


@pytest.fixture
def parallel_server(tiny_target, tiny_draft) -> Iterator[ParallelServer]:
    server = ParallelServer(tiny_target, tiny_draft, 64 << 20)
    yield server
    server.stop()


def test_a_copy_llama_cpp_refuses_is_dropped_and_the_prompt_decoded_afresh(
        parallel_server, monkeypatch):
    """Copies that llama.cpp refuses to take back (here: cut short as they are taken, so
    llama.cpp's own reading fails part-way): the request that wanted one still answers
    200 with the text the prompt gets without a cache, the copy leaves the cache rather
    than staying its most recently used, and every sequence's KV cache holds exactly
    what its bookkeeping says."""
    save = SeqView.save_state

    def cut_short(view: SeqView) -> KVState:
        state = save(view)
        return KVState(state.tokens, state.data[:len(state.data) // 2])

    monkeypatch.setattr(SeqView, "save_state", cut_short)
    server = parallel_server
    # A shared first word (fewer tokens than a copy is worth) sends b to a's slot.
    a, b = "the " + text(30, 150), "the " + text(31, 150)
    first = server.complete(a)
    assert first.status_code == 200, first.text
    assert server.complete(b).status_code == 200  # a's caches copied as b replaces them
    assert server.slots.figures().entries == 1
    again = server.complete(a)  # a's copy wanted back, and refused
    assert again.status_code == 200, again.text
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    figures = server.slots.figures()
    assert figures.entries == 1  # b's copy (taken as a came back); a's is gone
    assert figures.restore_failures == 1 and figures.hits == 0
    for engine in server.slots.slots:
        for view in (engine.decoder.target, engine.decoder.draft):
            assert view.pos_max() + 1 == len(view.cached)
    # No copy of a to try again: served from the live caches, the same text.
    third = server.complete(a)
    assert third.status_code == 200 and third.json()["choices"][0]["text"] == \
        first.json()["choices"][0]["text"]
    assert server.slots.figures().restore_failures == 1
