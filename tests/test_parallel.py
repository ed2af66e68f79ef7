"""`serve --parallel N`: several requests at once, each a sequence of one target context
(and one draft context), their rounds decoded in shared batches (engine/llama/batched.py,
server/slots.py). Each request must get what it would get alone: the same greedy tokens,
the target's own distribution for its own prompt, a KV cache no other request touches;
cancelling one stops only that one; and the server serves N at once."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from click.testing import CliRunner
from drafts import GREEDY
from servers import ServerProcess, starting
from test_cli import assert_one_line_error
from test_exactness import exact_first_two, goodness_of_fit

from specllama import (
    RoundVerified,
    SamplingParams,
    SpeculativeDecoder,
    TargetToken,
    TokensAccepted,
)
from specllama.cli import cli
from specllama.engine.constraint import ConstraintSpec
from specllama.engine.llama import Model
from specllama.engine.llama.batched import Batcher, SeqView
from specllama.loading import measure_costs
from specllama.server.jobs import Order, Outcome
from specllama.server.prompts import Work
from specllama.server.slots import Slots

DRAFTERS = ("lookup", "model")
PROMPTS = ["the cat sat on the mat and", "once upon a time there", "a b c d e f g",
           "Hello world", "the dog ran to the red ball while a bird sang"]
RUNS = 1000  # seeds per prompt in the distribution tests


def load(target, draft, n_seq: int = 1) -> SpeculativeDecoder:
    return SpeculativeDecoder(Model(target, n_ctx=512, n_threads=1, n_seq=n_seq),
                              Model(draft, n_ctx=512, n_threads=1, n_seq=n_seq))


@contextlib.contextmanager
def parallel(target, draft, n: int, cache_bytes: int = 0) -> Iterator[Slots]:
    """n slots over models loaded with n sequences, as `serve --parallel n` makes them
    (auto's costs measured first)."""
    decoder = load(target, draft, n)
    slots = Slots(decoder, lambda: measure_costs(decoder, "auto", False, lambda _: None),
                  cache_bytes)
    try:
        slots.prepare()
        yield slots
    finally:
        slots.close()


def order(i: int, tokens: list[int], *, max_tokens: int = 48, sampling=GREEDY,
          draft_max: int | str = 3, events="all") -> Order:
    return Order(i, Work("completion", list(tokens), max_tokens, sampling, ()), events,
                 draft_max, DRAFTERS)


def at_once(slots: Slots, orders: list[Order],
            put: Callable[[int, object], None] = lambda i, e: None,
            cancelled: Callable[[int], bool] = lambda i: False) -> list[Outcome]:
    """Every order run from its own thread, all started together."""
    def one(i: int) -> Outcome:
        outcome = slots.run(orders[i], lambda e: put(i, e), lambda: cancelled(i))
        assert outcome.failure is None, outcome.failure
        return outcome

    with ThreadPoolExecutor(len(orders)) as pool:
        return list(pool.map(one, range(len(orders))))


@pytest.fixture
def batches(monkeypatch) -> list[tuple[bool, int]]:
    """Every batch the batchers fire from now on: (of the target?, sequences in it)."""
    fired: list[tuple[bool, int]] = []
    fire = Batcher._fire

    def recording(self: Batcher, shares: list) -> None:
        fired.append((shares[0].view.base is self.base, len(shares)))
        fire(self, shares)

    monkeypatch.setattr(Batcher, "_fire", recording)
    return fired


def assert_batched(batches: list[tuple[bool, int]], at_least: float = 0.0) -> None:
    """Fewer batches than shares; some target batch, or `at_least` of them, held more
    than one sequence."""
    target = [n for is_target, n in batches if is_target]
    assert len(batches) < sum(n for _, n in batches)
    shared = sum(n > 1 for n in target)
    assert shared >= max(1, at_least * len(target)), (shared, len(target))


def views(slots: Slots) -> list[Model]:
    return [m for e in slots.slots for m in (e.decoder.target, e.decoder.draft)]


def assert_caches_consistent(slots: Slots) -> None:
    """Every slot's caches (target and draft): llama.cpp's end of the sequence is where
    `cached` says it is."""
    for view in views(slots):
        assert isinstance(view, SeqView)
        assert view.pos_max() + 1 == len(view.cached), (view.seq, view.path.name)


@pytest.fixture(scope="module")
def alone(tiny_target, tiny_draft):
    """The pair as one request at a time has it: one sequence, no batcher."""
    dec = load(tiny_target, tiny_draft)
    yield dec
    dec.close()


# ------------------------------------------------------------------------ greedy identity


def test_concurrent_greedy_requests_equal_each_request_alone(tiny_target, tiny_draft, alone,
                                                              batches):
    """Nine requests (five prompts; draft_max 0, 3 and auto) from nine threads on three
    slots give, token for token, what each gives alone; and they really were batched:
    rounds were verified beside other requests, in fewer decodes than the requests' own."""
    cases = [(PROMPTS[i % len(PROMPTS)], dm) for i, dm in enumerate([0, 3, "auto"] * 3)]
    expected = [alone.generate(p, max_tokens=48, sampling=GREEDY, draft_max=dm,
                               drafters=DRAFTERS).tokens for p, dm in cases]
    companions: list[int] = []
    with parallel(tiny_target, tiny_draft, 3) as slots:
        orders = [order(i, alone.tokenize(p), draft_max=dm) for i, (p, dm) in enumerate(cases)]
        outcomes = at_once(slots, orders, put=lambda i, e: isinstance(e, RoundVerified)
                           and companions.append(e.companions))
        assert [o.result.tokens for o in outcomes] == expected
        assert all(o.cache["consistent"] for o in outcomes)
        assert_caches_consistent(slots)
        assert_batched(batches)
        assert max(companions) >= 1, "no round shared its batch with another request"


# ------------------------------------------------------------- per-sequence distributions


def sample_first_two(slots: Slots, prompts: list[list[int]], params: SamplingParams,
                     draft_max: int) -> list[dict]:
    """Each prompt's counts of its first two tokens over RUNS seeds: one thread per
    prompt, so the prompts' requests run side by side."""
    def counts_for(prompt: list[int]) -> dict:
        counts: dict = {}
        for seed in range(RUNS):
            s = dataclasses.replace(params, seed=seed)
            out = slots.run(order(seed, prompt, max_tokens=2, sampling=s, draft_max=draft_max,
                                  events="end"), lambda e: None, lambda: False)
            assert out.failure is None, out.failure
            toks = out.result.tokens
            key = (toks[0], toks[1] if len(toks) > 1 else None)
            counts[key] = counts.get(key, 0) + 1
        return counts

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(counts_for, prompts))


def fit(counts: dict, exact: dict) -> float:
    """goodness_of_fit, where outcomes `exact` gives no mass count against it."""
    return goodness_of_fit(counts, {**{k: 1e-12 for k in counts}, **exact})


@pytest.fixture(scope="module")
def sampled_setup(tiny_target, tiny_draft):
    """Two prompts, the target's exact law of each one's first two tokens, and two
    slots (p_min 0: the draft model drafts whenever it may)."""
    probe = Model(tiny_target, n_ctx=256, n_threads=1)
    params = SamplingParams(temperature=0.8)
    prompts = [probe.tokenize(p, add_bos=probe.adds_bos) for p in PROMPTS[:2]]
    exact = [exact_first_two(probe, p, params) for p in prompts]
    probe.close()
    with parallel(tiny_target, tiny_draft, 2) as slots:
        for engine in slots.slots:
            engine.decoder.p_min = 0.0
        yield slots, prompts, params, exact


def test_concurrent_sampled_requests_follow_their_own_prompts_distribution(sampled_setup,
                                                                          batches):
    """Two prompts sampled side by side (draft_max 3: draft rows and verify rows read from
    shared batches) each follow the target's exact law of the first two tokens after
    THEIR prompt; the other prompt's law is rejected, so a request reading its
    neighbour's rows would fail here."""
    slots, prompts, params, exact = sampled_setup
    counts = sample_first_two(slots, prompts, params, draft_max=3)
    for own, (mine, other) in enumerate([(0, 1), (1, 0)]):
        assert fit(counts[own], exact[mine]) > 1e-3, f"prompt {own}"
        assert fit(counts[own], exact[other]) < 1e-6, f"prompt {own} fits the other's law"
    assert_batched(batches, 0.3)


def test_the_distribution_test_rejects_rows_read_at_the_wrong_offset(sampled_setup,
                                                                      monkeypatch, batches):
    """A view that reads its rows as if it were alone in the batch (row i, not its own
    offset + i) gets its neighbour's logits whenever they share a batch: the same check
    then fails (draft_max 0: every share is one row, so the wrong row is always there)."""
    slots, prompts, params, exact = sampled_setup
    own = SeqView.logits_row

    def alone(self, i):
        try:
            return self.shared.logits(i if i >= 0 else self._rows + i)
        except IndexError:  # that row of a neighbour's prompt chunk has no logits: own
            return own(self, i)

    monkeypatch.setattr(SeqView, "logits_row", alone)
    counts = sample_first_two(slots, prompts, params, draft_max=0)
    assert_batched(batches, 0.3)
    assert min(fit(counts[j], exact[j]) for j in range(2)) < 1e-6


# ------------------------------------------------------------------ each slot's KV cache


def run_on(slots: Slots, seq: int, order: Order) -> Outcome:
    """An order on slot `seq`, chosen here rather than by Slots.run (as Slots.run runs it)."""
    assert slots.batcher is not None
    with slots.batcher.active(seq):
        outcome = slots.slots[seq].run(order, lambda e: None, lambda: False)
    assert outcome.failure is None, outcome.failure
    return outcome


def test_a_request_on_one_slot_leaves_the_other_slots_cache_intact(tiny_target, tiny_draft,
                                                                   alone):
    """After every request each slot's caches end where `cached` says; slot 0 serving a
    conversation that grows and is cut back leaves slot 1's cells (target and draft) as
    they were, so a request on slot 1's prompt goes there, reuses all of it and answers
    the same."""
    a, b = (alone.tokenize(p) for p in PROMPTS[3:5])
    with parallel(tiny_target, tiny_draft, 2) as slots, ThreadPoolExecutor(2) as pool:
        first_a, first_b = pool.map(run_on, [slots] * 2, [0, 1], [order(1, a), order(2, b)])
        assert_caches_consistent(slots)
        slot_b = slots.slots[1].decoder
        kept = slot_b.target.save_state(), slot_b.draft.save_state()
        more = a + first_a.result.tokens + alone.target.tokenize(" the cat", add_bos=False)
        for i, prompt in enumerate([more, a, more]):
            assert run_on(slots, 0, order(3 + i, prompt)).cache["consistent"]
            assert_caches_consistent(slots)
        assert (slot_b.target.save_state(), slot_b.draft.save_state()) == kept
        again = slots.run(order(9, b), lambda e: None, lambda: False)
        assert again.result.stats.prompt_reused == len(b) - 1
        assert again.result.tokens == first_b.result.tokens
        assert_caches_consistent(slots)


def test_the_shared_prompt_cache_restores_one_slots_copy_into_another(tiny_target,
                                                                      tiny_draft, alone):
    """One prompt cache for every slot: the copy of a long prompt's caches made on slot 0
    (when slot 0 moved on to another prompt), brought back into slot 1, another sequence,
    gives the answer that prompt gets alone, with all of it reused."""
    words = "the cat sat on a mat and the dog ran to the red ball while a bird sang".split()
    rng = np.random.default_rng(0)
    first, second = (alone.tokenize(" ".join(rng.choice(words, 120))) for _ in range(2))
    expected = alone.generate(first, max_tokens=24, sampling=GREEDY, draft_max=3,
                              drafters=DRAFTERS).tokens
    with parallel(tiny_target, tiny_draft, 2, cache_bytes=64 << 20) as slots:
        run_on(slots, 0, order(1, first, max_tokens=24))
        run_on(slots, 0, order(2, second))
        again = run_on(slots, 1, order(3, first, max_tokens=24))
        assert again.result.tokens == expected
        assert again.result.stats.prompt_reused == len(first) - 1
        assert slots.figures().hits == 1
        assert_caches_consistent(slots)


# ---------------------------------------------------------------------------- cancelling


def test_cancelling_one_of_three_concurrent_requests_stops_only_that_one(tiny_target,
                                                                         tiny_draft, alone):
    """The middle request is cancelled after its third piece of text: it ends
    'interrupted' with a prefix of its full answer; the other two finish theirs; every
    cache is consistent and the cancelled slot serves its next request exactly."""
    prompts = [alone.tokenize(p) for p in PROMPTS[:3]]
    full = [alone.generate(p, max_tokens=96, sampling=GREEDY, draft_max=3,
                           drafters=DRAFTERS).tokens for p in prompts]
    pieces = [0, 0, 0]

    def put(i: int, event: object) -> None:
        pieces[i] += isinstance(event, (TokensAccepted, TargetToken))

    with parallel(tiny_target, tiny_draft, 3) as slots:
        orders = [order(i, p, max_tokens=96, events="text") for i, p in enumerate(prompts)]
        outcomes = at_once(slots, orders, put, cancelled=lambda i: i == 1 and pieces[1] >= 3)
        cut = outcomes[1].result
        assert cut.finish_reason == "interrupted" and 0 < len(cut.tokens) < len(full[1])
        assert cut.tokens == full[1][:len(cut.tokens)]
        assert [outcomes[i].result.tokens for i in (0, 2)] == [full[0], full[2]]
        assert all(o.cache["consistent"] for o in outcomes)
        assert_caches_consistent(slots)
        again = at_once(slots, [order(4, prompts[1], max_tokens=96)])[0]
        assert again.result.tokens == full[1]


# ------------------------------------------------------------------------ a real server


@pytest.fixture(scope="module")
def start(tiny_target, tiny_draft, tmp_path_factory):
    """start(*extra_args) -> `specllama serve --parallel 2` on the tiny pair."""
    with starting(tmp_path_factory, "parallel", "--target", tiny_target, "--draft", tiny_draft,
                  "--threads", 1, "--n-ctx", 4096, "--draft-max", 3, "--temperature", 0,
                  "--parallel", 2) as make:
        yield make


def complete(server: ServerProcess, prompt: str, max_tokens: int = 40) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})


def test_the_server_answers_concurrent_clients_as_it_answers_them_one_by_one(start):
    """Three clients at once on two slots (the third waits for one): all 200, each text
    the one the same request gets alone; /health says parallel 2."""
    server = start()
    assert server.health()["parallel"] == 2
    prompts = PROMPTS[:3]
    one_by_one = [complete(server, p).json()["choices"][0]["text"] for p in prompts]
    with ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(lambda p: complete(server, p), prompts))
    assert [r.status_code for r in replies] == [200] * 3
    assert [r.json()["choices"][0]["text"] for r in replies] == one_by_one
    health = server.wait_idle()
    assert health["requests"]["completed"] == 6 and health["cache"]["consistent"] is True


def streamed(server: ServerProcess, body: dict):
    return httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True},
                        timeout=60)


def pieces(response: httpx.Response) -> Iterator[str]:
    assert response.status_code == 200
    return (json.loads(line[6:])["choices"][0]["text"] for line in response.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]")


def test_with_no_queue_a_third_request_gets_503_while_two_are_served(start):
    """--queue 0: two streams hold both slots; a third request is turned away with
    Retry-After; a client leaving one stream stops only its request, and the other
    stream still sends its full text."""
    server = start("--queue", 0)
    body = {"model": server.model, "prompt": "the cat and the dog", "temperature": 0,
            "max_tokens": 4000}
    # Long enough to hold a slot, short enough that no near-tie of the tiny random model
    # flips with the cache's layout (at 2000 tokens one did: test_parallel_ties.py).
    other = {**body, "prompt": "a b c d e f g", "max_tokens": 500}
    reference = httpx.post(f"{server.url}/v1/completions", json=other, timeout=60).json()
    assert reference["usage"]["completion_tokens"] == 500
    with streamed(server, other) as stays, streamed(server, body) as leaves:
        kept, left = pieces(stays), pieces(leaves)  # (closing an iterator closes its stream)
        text = [next(kept)]
        next(left)  # both are being served
        busy = complete(server, "Hello world")
        health = server.health()
        assert busy.status_code == 503 and int(busy.headers["retry-after"]) >= 1
        assert health["serving"] == 2 and health["parallel"] == 2
        leaves.close()  # the client leaves: that request is cancelled
        text += kept
    assert "".join(text) == reference["choices"][0]["text"]
    counts = server.wait_idle()["requests"]
    assert [counts[k] for k in ("completed", "cancelled", "rejected", "failed")] == [2, 1, 1, 0]
    assert server.health()["cache"]["consistent"] is True


def test_parallel_0_is_a_one_line_error():
    """`serve --parallel 0` is refused by the option itself, before anything loads."""
    result = CliRunner().invoke(cli, ["serve", "--parallel", "0", "--target", "x.gguf",
                                      "--draft", "lookup"])
    assert_one_line_error(result, "--parallel", "0")


def test_a_forced_run_longer_than_a_sequences_share_of_the_batch_is_verified_over_rounds(
        tiny_target, tiny_draft):
    """A constraint may force more tokens than one sequence's share of a batch (n_batch /
    N) holds: they are verified over several rounds, not refused."""
    forced = " ".join(["the cat sat on the mat"] * 8)
    spec = ConstraintSpec("regex", forced + " [a-z ]{1,8}")
    decoder = SpeculativeDecoder(Model(tiny_target, n_ctx=512, n_threads=1, n_seq=4, n_batch=64),
                                 Model(tiny_draft, n_ctx=512, n_threads=1, n_seq=4))
    slots = Slots(decoder)
    try:
        slots.prepare()
        work = Work("completion", decoder.tokenize("Hello world"), 80, GREEDY, (),
                    constraint=spec)
        outcome = slots.run(Order(1, work, "end", 3, DRAFTERS), lambda e: None, lambda: False)
        assert outcome.failure is None, outcome.failure
        assert outcome.result is not None and outcome.result.text.startswith(forced)
        assert len(decoder.tokenize(forced)) > 64 // 4  # longer than one share
    finally:
        slots.close()
