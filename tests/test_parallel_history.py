"""`serve --parallel`: one suffix cache for every slot. A request drafts from what any
slot answered before, and answers joining the history (evictions included) while other
requests read it change nothing of what those requests generate."""

from __future__ import annotations

import dataclasses

from drafts import GREEDY
from test_parallel import PROMPTS, at_once, load, order, parallel, run_on

from specllama import RoundVerified
from specllama.engine.drafting.draftcache import DraftCache


def test_a_slot_drafts_from_what_another_slot_answered(tiny_target, tiny_draft):
    with parallel(tiny_target, tiny_draft, 2) as slots:
        prompt = slots.slots[0].decoder.tokenize(PROMPTS[0])
        first = run_on(slots, 0, order(1, prompt, draft_max=0))
        rounds: list[RoundVerified] = []
        engine = slots.slots[1]
        assert slots.batcher is not None
        with slots.batcher.active(1):
            again = engine.run(order(2, prompt, draft_max=4),
                               lambda e: isinstance(e, RoundVerified) and rounds.append(e),
                               lambda: False)
    assert again.result.tokens == first.result.tokens
    copied = sum(r.accepted for r in rounds if "session" in r.origins)
    assert copied >= len(first.result.tokens) // 2, copied


def test_answers_joining_a_small_history_while_others_read_it_change_no_answer(
        tiny_target, tiny_draft):
    """Nine requests on three slots whose one history holds 200 tokens: it is evicted
    and rebuilt while other requests draft from it; each answer is still its own."""
    cases = [PROMPTS[i % len(PROMPTS)] for i in range(9)]
    alone = load(tiny_target, tiny_draft)
    expected = [alone.generate(p, max_tokens=48, sampling=GREEDY, draft_max=3,
                               drafters=("lookup",), draft_cache=False).tokens for p in cases]
    prompts = [alone.tokenize(p) for p in cases]
    alone.close()
    with parallel(tiny_target, tiny_draft, 3) as slots:
        shared = DraftCache(max_tokens=200)
        for engine in slots.slots:
            engine.decoder.draft_cache = shared
        orders = [dataclasses.replace(order(i, p), drafters=("lookup",))
                  for i, p in enumerate(prompts)]
        outcomes = at_once(slots, orders)
        assert [o.result.tokens for o in outcomes] == expected
        assert 0 < shared.history.n_tokens <= 200
