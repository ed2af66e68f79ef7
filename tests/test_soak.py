"""A long chat on the tiny models: KV invariants after every round, repeated context
overflow, and memory that does not grow with the number of turns."""

import itertools

from specllama import (
    DraftProposed,
    Finished,
    PromptEvaluated,
    SpeculativeDecoder,
    TargetToken,
    TokensAccepted,
)
from specllama.cli.chat import ChatSession, HistoryTrimmed
from specllama.loading import RunSettings

TURNS = 36
LINES = ["hello world", "the cat and the dog", "what is that", "tell me some more",
         "I see a cat", "how are you", "they had one", "we like it"]


def rss_kib() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def test_a_long_chat_keeps_its_caches_consistent_and_its_memory_flat(tiny_target, tiny_draft):
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=256, n_threads=1, p_min=0.0)
    settings = RunSettings(temperature=0.9, seed=5, max_tokens=80,
                           draft_max="auto", drafters=("model",), n_ctx=dec.n_ctx, threads=1)
    session = ChatSession(dec, settings, system="You are terse.")
    target, draft = dec.target, dec.draft
    trims = rounds = generated_total = 0
    rss_early = None
    for turn, line in zip(range(TURNS), itertools.cycle(LINES)):
        session.set("draft_max", ["auto", 4, 0, 7][turn % 4])  # every policy, mid-chat
        prompt_prefix: list[int] = []
        generated: list[int] = []
        drafted_this_round = False
        for event in session.reply(f"{line} {turn}"):
            if isinstance(event, HistoryTrimmed):
                trims += 1
            elif isinstance(event, DraftProposed):
                drafted_this_round = event.source == "model"
            elif isinstance(event, PromptEvaluated):
                prompt_prefix = list(target.cached)  # the prompt minus its last token
                assert len(prompt_prefix) == event.n_tokens - 1
            elif isinstance(event, (TokensAccepted, TargetToken)):
                generated += event.tokens if isinstance(event, TokensAccepted) else [event.token]
                if isinstance(event, TargetToken):
                    rounds += 1
                    # the target holds exactly prompt + generated, minus the newest token
                    cached = target.cached
                    last_prompt_token = cached[len(prompt_prefix)]
                    committed = prompt_prefix + [last_prompt_token] + generated
                    assert cached == committed[:-1]
                    assert target.pos_max() + 1 == len(cached)
                    # the draft holds a prefix of the same tokens: at most one behind
                    # after it drafted; further behind after plain target steps (it
                    # catches up, in one batch, the next time it drafts)
                    n = len(draft.cached)
                    assert draft.cached == committed[:n]
                    assert n <= len(committed) - 1
                    if drafted_this_round:
                        assert n >= len(committed) - 2
                    assert draft.pos_max() + 1 == n
                    drafted_this_round = False
            elif isinstance(event, Finished):
                generated_total += len(event.result.tokens)
        assert session.cache_report().consistent, session.cache_report()
        if turn == 5:
            rss_early = rss_kib()
    assert trims >= 3, "the context should have overflowed several times"
    assert generated_total >= 2000
    assert rounds >= TURNS
    assert session.totals.drafted > 500 and session.totals.accepted > 0
    # KV cache and buffers are allocated once; 36 turns must not add more than a few MiB.
    assert rss_kib() - rss_early < 16 * 1024
    # the conversation still works and the system prompt survived every trim
    assert session.system == "You are terse."
    assert list(session.reply("last one"))[-1].result.finish_reason in ("eos", "length")
    dec.close()
