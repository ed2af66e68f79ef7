"""The prompt cache across requests: KV copies of earlier prompts, restored exactly and
kept within their limit; through the engine and through a real `specllama serve`."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from drafts import GREEDY
from servers import ServerProcess

from specllama import SpeculativeDecoder
from specllama.engine.llama import Model
from specllama.server.jobs import Order, Slot
from specllama.server.promptcache import MIN_GAIN, PromptCache, shared
from specllama.server.prompts import Work

WORDS = "the cat sat on a mat and the dog ran to the red ball while a bird sang".split()


def text(seed: int, n_words: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, n_words))


def test_a_restored_cache_gives_the_logits_a_fresh_one_does(tiny_target):
    m = Model(tiny_target, n_ctx=512, n_threads=1)
    try:
        a, b = m.tokenize(text(1, 60)), m.tokenize(text(2, 60))
        m.decode(a[:-1], "none")
        saved = m.save_state()
        m.decode(a[-1:], "last")
        fresh = m.logits_row(0).copy()
        m.clear()
        m.decode(b, "none")
        m.restore(saved)
        assert m.cached == a[:-1] and m.pos_max() == len(a) - 2
        m.decode(a[-1:], "last")
        assert np.array_equal(m.logits_row(0), fresh)
    finally:
        m.close()


def test_shared_is_the_common_prefix():
    assert shared((1, 2, 3), [1, 2, 4]) == 2
    assert shared((1, 2), [1, 2, 3]) == 2 and shared((), [1]) == 0 and shared((5,), [6]) == 0


@pytest.fixture
def decoder(tiny_target, tiny_draft):
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=512, n_threads=1)
    yield dec
    dec.close()


def run(engine: Slot, tokens: list[int], max_tokens: int = 16):
    work = Work("completion", tokens, max_tokens, GREEDY, ())
    outcome = engine.run(Order(1, work, "end", 3, ("lookup", "model")), lambda e: None,
                         lambda: False)
    assert outcome.failure is None
    return outcome


def test_two_conversations_taking_turns_are_not_evaluated_again(decoder, tiny_target,
                                                                 tiny_draft):
    engine = Slot(decoder, cache_bytes=64 << 20)
    a, b = decoder.tokenize(text(3, 150)), decoder.tokenize(text(4, 150))
    first_a = run(engine, a)
    run(engine, b)
    before = decoder.target.tokens_evaluated
    more = a + first_a.result.tokens + decoder.target.tokenize(" the cat", add_bos=False)
    again = run(engine, more)
    evaluated = decoder.target.tokens_evaluated - before
    f = again.prompt_cache
    assert f.hits == 1 and f.tokens_restored >= len(a) and f.entries >= 1
    assert again.result.stats.prompt_reused >= len(a)
    assert evaluated < 60  # the new words and the verify passes, not the 150-word text
    # exact: what a decoder that never saw the other conversation generates
    fresh = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=512, n_threads=1)
    try:
        alone = fresh.generate(more, max_tokens=16, sampling=GREEDY, draft_max=0)
    finally:
        fresh.close()
    assert again.result.tokens == alone.tokens


def test_without_the_cache_the_text_is_evaluated_again(decoder):
    engine = Slot(decoder, cache_bytes=0)
    a, b = decoder.tokenize(text(3, 150)), decoder.tokenize(text(4, 150))
    run(engine, a)
    run(engine, b)
    again = run(engine, a)
    assert again.prompt_cache.hits == 0 and again.result.stats.prompt_reused <= MIN_GAIN


def test_copies_stay_within_the_limit_least_recently_used_out_first(decoder):
    prompts = [decoder.tokenize(text(10 + i, 120)) for i in range(4)]
    run(Slot(decoder, cache_bytes=1 << 30), prompts[0], max_tokens=1)
    one = decoder.target.save_state()
    draft_one = decoder.draft.save_state()
    # room for two copies of both models' caches, not three
    limit = int(2.5 * (len(one.data) + len(draft_one.data)))
    cache = PromptCache(limit)
    engine = Slot(decoder, cache_bytes=limit)
    engine.prompt_cache = cache
    for p in prompts:
        run(engine, p, max_tokens=1)
        assert cache.figures().bytes <= limit
    assert cache.figures().entries == 2  # prompts 1 and 2: 0 was least recently used
    evicted = run(engine, prompts[0], max_tokens=1)
    assert evicted.result.stats.prompt_reused <= MIN_GAIN and cache.figures().hits == 0
    kept = run(engine, prompts[2], max_tokens=1)
    assert kept.result.stats.prompt_reused == len(prompts[2]) - 1
    assert cache.figures().hits == 1


def test_a_copy_of_a_prefix_of_another_is_not_kept_twice(decoder):
    engine = Slot(decoder, cache_bytes=64 << 20)
    a, b = decoder.tokenize(text(5, 120)), decoder.tokenize(text(6, 120))
    first = run(engine, a)
    run(engine, b)  # a copy of a's conversation
    run(engine, a + first.result.tokens + decoder.target.tokenize(" a dog ran", add_bos=False))
    run(engine, decoder.tokenize(text(7, 120)))  # a copy of the longer conversation
    assert engine.prompt_cache.figures().entries == 2  # b's, the longer one's; not a's


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    s = ServerProcess(["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
                       "--n-ctx", 512, "--draft-max", 3, "--temperature", 0,
                       "--max-tokens", 8, "--cache-mib", 64],
                      tmp_path_factory.mktemp("promptcache"))
    yield s
    s.kill()


def test_the_server_serves_alternating_system_prompts_from_the_cache(server):
    client = server.client()
    systems = [text(20, 150), text(21, 150)]

    def ask(system: str, question: str) -> str:
        r = client.chat.completions.create(
            model=server.model, max_tokens=8,
            messages=[{"role": "system", "content": system},
                      {"role": "user", "content": question}])
        return r.choices[0].message.content

    answers = [ask(systems[i % 2], f"the {w}") for i, w in enumerate(["cat", "dog", "mat"])]
    health = httpx.get(f"{server.url}/health", timeout=30).json()
    assert health["prompt_cache"]["hits"] == 1  # the third: the first system prompt again
    assert 0 < health["prompt_cache"]["bytes"] <= 64 << 20
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert "specllama_prompt_cache_hits_total 1" in metrics
    assert answers[2] == ask(systems[0], "the mat")  # the same answer from the live cache
