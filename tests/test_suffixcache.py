"""The suffix cache: the archive of earlier text (index, candidates, eviction) and the
pooled lookup chain that drafts from it, without any model."""

from __future__ import annotations

import numpy as np
import pytest

from specllama.engine.drafting.lookup import LookupDrafter, likeliest_continuation
from specllama.engine.drafting.suffixcache import (
    LONG,
    SHORT,
    SuffixArchive,
    key_of,
    ngram_keys,
)


def test_ngram_keys_match_the_python_hash_and_skip_separators():
    toks = np.array([5, 6, 7, 8, -1, 9, 10, 11, 12], np.int32)
    keys, pos = ngram_keys(toks, 3, offset=100)
    # followers: c = 3 (after 5 6 7) only; c = 4 is a separator, windows over it dropped;
    # c = 8 follows 9 10 11
    assert pos.tolist() == [103, 108]
    assert keys.tolist() == [key_of([5, 6, 7]), key_of([9, 10, 11])]


def test_candidates_find_the_latest_occurrences_and_measure_their_lengths():
    a = SuffixArchive()
    a.add([1, 2, 3, 4, 5, 6, 7, 8], "session")
    a.add([9, 3, 4, 5, 6, 7, 0], "corpus")
    found = a.candidates([0, 2, 3, 4, 5, 6, 7])
    # "3 4 5 6 7" occurs in both documents: followed by 8 (agreeing 6 tokens: 2 3 4 5 6 7)
    # and by 0 (5 tokens: 9 differs from 2); the newest document first
    assert [(int(a.tokens[p]), n) for p, n in found] == [(0, 5), (8, 6)]
    assert [a.origin_at(p) for p, _ in found] == ["corpus", "session"]
    assert a.candidates([9, 9, 9, 9, 9, 9]) == []
    assert a.candidates([6, 7]) == []  # shorter than SHORT
    assert [n for _, n in a.candidates([0, 5, 6, 7])] == [3, 3]


def test_long_order_finds_real_copying_among_many_short_matches():
    a = SuffixArchive()
    common = [1, 2, 3, 4, 5]
    for i in range(100):  # "1 2 3 4 5" everywhere, each followed by something else
        a.add([*common, 100 + i], "session")
    passage = list(range(20, 40))
    a.add([7, 7, *passage, 99], "session")
    a.add([*common, 555], "session")  # the latest short match
    found = a.candidates(passage[:12])
    assert len(found) == 1 and found[0][1] == 12 and a.tokens[found[0][0]] == passage[12]
    assert a.continuation(found[0][0], 100) == [*passage[12:], 99]  # stops at the end
    # the short order: the latest PER_SEGMENT occurrences of a frequent n-gram, newest first
    found = a.candidates([0, *common])
    assert int(a.tokens[found[0][0]]) == 555 and all(n == 5 for _, n in found)


def test_segments_stay_few_and_lookups_see_every_document():
    a = SuffixArchive()
    for i in range(300):
        a.add([i, i + 1, i + 2, i + 3, i + 4, i + 5, 1000 + i], "session")
    for n in (SHORT, LONG):
        assert len(a.segments[n]) <= 6
    for i in (0, 150, 299):
        found = a.candidates([i, i + 1, i + 2, i + 3, i + 4, i + 5])
        assert [int(a.tokens[p]) for p, n in found if n == 6] == [1000 + i]


def test_eviction_keeps_the_most_recently_used_documents():
    a = SuffixArchive(max_tokens=100)
    for i in range(5):
        a.add([i] * 10 + [50 + i, 60 + i, 70 + i, 80 + i, 90 + i, 95 + i] + [i] * 14, "session",
              used=float(i))
    # at 120 tokens > 100 the newest that fit in 75 were kept (two of 30), then one more
    assert a.n_tokens == 90 and a.n_documents == 3
    assert a.candidates([50, 60, 70, 80, 90]) == []
    found = a.candidates([54, 64, 74, 84, 94])
    assert [int(a.tokens[p]) for p, _ in found] == [99]
    a.touch(found[0][0])  # used now: outlives the next evictions
    for i in range(5, 8):
        a.add([i] * 30, "session", used=float(i))
    assert len(a.candidates([54, 64, 74, 84, 94])) == 1


def test_likeliest_chain_counts_agreeing_continuations():
    conts = [[1, 2, 3], [1, 2, 4], [1, 5], [1, 2, 4]]
    tokens, probs, first = likeliest_continuation(conts, 5)
    assert tokens == [1, 2, 4]
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    assert probs == pytest.approx([1.0, 3 / 4, 2 / 3])
    assert first == 1  # the first continuation agreeing to the end
    assert likeliest_continuation([], 3) == ([], [], 0)
    # a tie goes to the earliest given (the most recent occurrence)
    assert likeliest_continuation([[7], [8]], 1)[0] == [7]


def test_lookup_draws_from_the_archive_with_its_origin_and_probabilities():
    history = SuffixArchive()
    fmt = [10, 11, 12, 13, 14, 15]  # a fixed format, then a value that differs each time
    for value in (20, 21, 22, 20):
        history.add([*fmt, value, 16, 17, 18], "session")
    draft = LookupDrafter(archives=[(history, None)])
    ctx = [1, 2, *fmt]
    assert draft.has_match(ctx) and draft.match_length() == 6
    chain = draft.continuation(ctx, 8)
    assert chain is not None and chain.origin == "session"
    # pytest.approx's 1e-6 relative: float64 arithmetic of a few terms, exact to ~1e-15
    # 20 follows the format in 2 of 4, then 16 17 always; k capped at 6 - 3 + 1 = 4
    assert chain.tokens == [20, 16, 17, 18] and chain.probs == pytest.approx([0.5, 1, 1, 1])
    # the context's own match counts too, first: a longer one wins alone
    ctx2 = [*fmt, 30, 31, 32, 33, 34, 35, 36, 37, 9, *fmt, 30, 31, 32, 33, 34, 35, 36, 37]
    chain = draft.continuation(ctx2, 4)
    assert chain is not None and (chain.tokens, chain.origin) == ([9, 10, 11, 12], "context")


def test_lookup_without_archives_is_todays_prompt_lookup():
    ctx = [5, 6, 7, 8, 9, 1, 5, 6, 7]
    chain = LookupDrafter().continuation(ctx, 4)
    assert chain is not None and chain.tokens == [8] and chain.origin == "context"


def test_documents_added_at_once_are_found_as_those_added_one_by_one():
    docs = [[i % 7, (i * 3) % 11, i % 5, 100 + i] * 3 for i in range(50)]
    one, many = SuffixArchive(), SuffixArchive()
    for d in docs:
        one.add(d, "session")
    many.add_many([(d, "persisted", 1.0) for d in docs])
    assert len(many.segments[SHORT]) == 1 and many.n_tokens == one.n_tokens
    for d in docs[::7]:
        assert sorted(many.candidates(d[:6])) == sorted(one.candidates(d[:6]))
    assert many.documents()[3][1:] == ("persisted", 1.0)


# Replies of one shape: {"a": <value>, "b": <value>, "c": <value>}, with values of
# their own. OPEN, KEY_x, SAY (": "), NEXT (",\n  "), CLOSE stand for the format's tokens.
OPEN, SAY, NEXT, CLOSE = 3, 4, 5, 6
KEY_A, KEY_B, KEY_C = 100, 101, 102
ASK = [7, 8, 9]  # the end of every prompt (the chat template's assistant header)


def reply(a: list[int], b: list[int], c: list[int]) -> list[int]:
    return [*ASK, OPEN, KEY_A, SAY, *a, NEXT, KEY_B, SAY, *b, NEXT, KEY_C, SAY, *c, CLOSE]


def following_draft() -> LookupDrafter:
    history = SuffixArchive()
    history.add(reply([20, 21], [30], [40, 41, 42]), "session")
    history.add(reply([22], [31, 32], [43]), "session")
    history.add(reply([23, 24, 25], [33], [44, 45]), "session")
    return LookupDrafter(archives=[(history, None)])


def test_a_reply_of_one_shape_follows_earlier_ones_past_its_own_values():
    draft = following_draft()
    text = [1, 2, *ASK]
    first = draft.continuation(text, 8)  # the prompt's end: a plain match of 3, one token
    assert first is not None and first.tokens == [OPEN] and len(draft.following) >= 2
    text += [OPEN, KEY_A, SAY, 90, 91, 92]  # a value no reply had
    assert not draft.has_match(text)  # nothing to follow inside a value
    text += [NEXT]
    # After the value, NEXT matches after every key; following finds the one where each
    # reply's own value ended: key b comes next, in all three.
    assert draft.has_match(text) and draft.follows()
    chain = draft.continuation(text, 3)
    assert chain is not None and chain.origin == "session"
    assert chain.tokens[:2] == [KEY_B, SAY] and chain.probs[:2] == [1.0, 1.0]
    text += [KEY_B, SAY, 93, NEXT]  # in step through the key, then another own value
    chain = draft.continuation(text, 2)
    assert chain is not None and chain.tokens == [KEY_C, SAY]


def test_a_model_draft_takes_free_what_the_followed_replies_agree_on():
    draft = following_draft()
    text = [1, 2, *ASK]
    draft.continuation(text, 8)
    text += [OPEN, KEY_A, SAY, 90]
    draft.has_match(text)  # the round settles: the replies are walked to here
    # A draft in progress: the model drew 91 (a value), then NEXT: the fixed part after
    # it comes free, up to the next value, where the replies disagree.
    assert draft.agreed([*text, 91], 8)[0] == []
    assert draft.agreed([*text, 91, NEXT], 8) == ([KEY_B, SAY], "session")
    assert draft.agreed([*text, 91, NEXT], 1) == ([KEY_B], "session")
    # It reads nothing the round changes: asking again gives the same.
    assert draft.agreed([*text, 91, NEXT], 8) == ([KEY_B, SAY], "session")


def test_one_followed_reply_alone_splices_nothing():
    history = SuffixArchive()
    history.add(reply([20], [30], [40]), "session")
    draft = LookupDrafter(archives=[(history, None)])
    text = [1, 2, *ASK]
    draft.continuation(text, 8)
    text += [OPEN, KEY_A, SAY, 90]
    draft.has_match(text)
    assert not len(draft.following) >= 2 and draft.agreed([*text, NEXT], 8)[0] == []


def test_around_stays_inside_the_document():
    archive = SuffixArchive()
    archive.add([1, 2, 3, 4], "session")
    archive.add([5, 6, 7], "session")
    start = archive.starts[1]
    assert archive.around(start + 1, 4, 10) == ([5, 6, 7], 1)
    assert archive.around(start - 2, 1, 10) == ([3, 4], 1)
