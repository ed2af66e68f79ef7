"""A stop string ends generation cleanly: the tokens, the stats and both KV caches keep
only the history up to the stop (at most the token the stop text begins in), and no
token event follows the stop."""

import pytest

from specllama import (
    Finished,
    SamplingParams,
    SpeculativeDecoder,
    TargetToken,
    TextFlushed,
    TokensAccepted,
)

GREEDY = SamplingParams(temperature=0.0)
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def dec(tiny_target, tiny_draft):
    d = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=512, n_threads=1, p_min=0.0)
    yield d
    d.close()


@pytest.fixture(scope="module")
def full(dec):
    """The greedy continuation without stops, and each token's text."""
    res = dec.generate(PROMPT, max_tokens=60, sampling=GREEDY, draft_max=0)
    pieces = [dec.target.detokenize([t]) for t in res.tokens]
    assert len(res.tokens) > 20 and "".join(pieces) == res.text
    return res.tokens, pieces


def stops_at_token(pieces: list[str], n_tokens: int, *, mid: bool) -> tuple[str, int]:
    """A stop string spanning three tokens that begins in token i >= 8 (at its start, or one
    character into it) and occurs nowhere earlier; returns it and i."""
    for i in range(8, len(pieces) - 3):
        if mid and len(pieces[i]) < 2:
            continue
        start = sum(len(p) for p in pieces[:i]) + (1 if mid else 0)
        stop = "".join(pieces[i : i + 3])[1 if mid else 0 :]
        if "".join(pieces).find(stop) == start:
            return stop, i
    # The tiny models are the same on every machine: a continuation without one is a
    # change to them (tests/tinymodels.py) that this test must not quietly skip over.
    pytest.fail("no stop string of three tokens occurs first at token 8 or later in the "
                "greedy continuation: choose another PROMPT")


def run(dec, stop, **kw):
    events = list(dec.stream(PROMPT, max_tokens=60, sampling=GREEDY, stop=[stop], **kw))
    result = events[-1].result
    return events, result


@pytest.mark.parametrize("draft_max", [0, 1, 4, 8])
@pytest.mark.parametrize("mid", [False, True], ids=["at a token boundary", "inside a token"])
def test_a_stop_keeps_exactly_the_visible_history(dec, full, draft_max, mid):
    tokens, pieces = full
    stop, i = stops_at_token(pieces, len(tokens), mid=mid)
    events, res = run(dec, stop, draft_max=draft_max)

    assert res.finish_reason == "stop"
    assert res.text == "".join(pieces)[: "".join(pieces).find(stop)]
    # tokens: the text, plus (inside a token) the one token the stop begins in
    assert res.tokens == tokens[: i + (1 if mid else 0)]
    assert dec.target.detokenize(res.tokens).startswith(res.text)
    assert res.stats.tokens == len(res.tokens)
    # both caches hold the kept history less its newest token, nothing past the stop
    history = dec.tokenize(PROMPT) + res.tokens
    assert dec.target.cached == history[:-1]
    assert dec.draft.cached == history[: len(dec.draft.cached)]
    # the events tell the same story, and nothing but text follows the stop
    shown = "".join(e.text for e in events if isinstance(e, (TokensAccepted, TargetToken,
                                                             TextFlushed)))
    assert shown == res.text
    last_round = max(j for j, e in enumerate(events) if not isinstance(e, (TextFlushed, Finished)))
    assert all(isinstance(e, (TextFlushed, Finished)) for e in events[last_round + 1 :])
    assert isinstance(events[-1], Finished)


def test_the_next_turn_continues_from_the_visible_text(dec, full):
    """As in a chat: the next call resends the history and only its new tokens are read."""
    tokens, pieces = full
    stop, i = stops_at_token(pieces, len(tokens), mid=True)
    _, res = run(dec, stop, draft_max=4)
    history = dec.tokenize(PROMPT) + res.tokens
    follow = history + dec.tokenize(" and")[1:]
    before = dec.target.tokens_evaluated
    nxt = dec.generate(follow, max_tokens=8, sampling=GREEDY, draft_max=4, keep_cache=True)
    assert nxt.stats.prompt_reused == len(history) - 1  # all the cache held: nothing past the stop
    cold = dec.generate(follow, max_tokens=8, sampling=GREEDY, draft_max=0)
    assert nxt.tokens == cold.tokens
    assert dec.target.tokens_evaluated > before


def test_a_stop_at_the_very_start_keeps_nothing(dec, full):
    tokens, pieces = full
    _, res = run(dec, pieces[0], draft_max=4)
    assert res.finish_reason == "stop" and res.text == "" and res.tokens == []
    assert res.stats.tokens == 0
    assert dec.target.cached == dec.tokenize(PROMPT)[:-1]


def test_the_stop_cut_reads_each_token_once():
    """Where a stop string ends a long output, finding the token it begins in decodes the
    output once, not every prefix of it (that was quadratic in the output's length)."""
    from specllama.engine.loop.rounds import tokens_covering

    reads = []

    def piece(token: int) -> bytes:
        reads.append(token)
        return b"ab"

    tokens = list(range(4000))
    assert tokens_covering(piece, tokens, 7001) == 3501
    assert len(reads) == 3501


def test_the_stop_cut_keeps_a_character_split_across_tokens_whole():
    """'é' is two bytes in two tokens before a stop at character 2: both are kept, and the
    half of it alone counts no character."""
    from specllama.engine.loop.rounds import tokens_covering

    pieces = {0: b"a", 1: "é".encode()[:1], 2: "é".encode()[1:], 3: b"STOP"}
    assert tokens_covering(pieces.__getitem__, [0, 1, 2, 3], 2) == 3
    assert tokens_covering(pieces.__getitem__, [0, 1, 2, 3], 3) == 4


# ------------------------------------------------- a block written twice (Repeat)

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
OTHER = '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>'


def released(text: str, cuts: tuple[int, ...], stops=()) -> tuple[str, str, bool]:
    """`text` fed to a TextStream in the pieces `cuts` makes: what went out while it
    streamed, what it holds in the end, and whether it stopped."""
    from specllama import Repeat
    from specllama.engine.loop.textstream import TextStream

    stream = TextStream(lambda t: bytes([t]), [*stops, Repeat("<tool_call>\n",
                                                              "\n</tool_call>")])
    out, at = "", 0
    for cut in (*cuts, len(text)):
        out += stream.feed(list(text[at:cut].encode()))
        at = cut
    return out, out + stream.flush(), stream.stopped


@pytest.mark.parametrize("answer, expected", [
    (CALL + "\n" + CALL + "\n" + CALL, CALL + "\n"),  # the second call ends it
    (CALL + "\n" + OTHER + "\n" + CALL, CALL + "\n" + OTHER + "\n"),
    (CALL + "\n" + OTHER, CALL + "\n" + OTHER),  # no repeat: all of it
    ("text <tool_call>\nx\n</tool_call> and <tool_call>\nx", None),  # an open one is no cut
])
def test_a_call_made_twice_ends_the_text_wherever_the_pieces_break(answer, expected):
    whole = expected if expected is not None else answer
    for i in range(len(answer) + 1):
        for j in range(i, len(answer) + 1, 7):
            out, end, stopped = released(answer, (i, j))
            assert end == whole and stopped == (expected is not None and whole != answer)
            # nothing that may still turn out a repeat went out before it was known
            assert whole.startswith(out)


def test_the_first_repeat_or_stop_string_ends_it():
    text = CALL + "\nEND" + CALL
    assert released(text, (), stops=("END",))[1] == CALL + "\n"
    text = CALL + "\n" + CALL + "END"
    assert released(text, (3, 60), stops=("END",))[1] == CALL + "\n"


def test_a_repeat_rule_leaves_the_output_before_its_cut_as_it_was(dec):
    """A stop rule cuts; it does not steer: with the same seed and draft length, the
    output under the rule is the output without it, up to the cut."""
    from specllama import Repeat

    rule, fired = Repeat("o", " "), 0  # a word ending in "o" written twice: "do", "ho"...
    for seed in range(4):
        sampling = SamplingParams(temperature=1.0, seed=seed)
        free = dec.generate(PROMPT, max_tokens=60, sampling=sampling, draft_max=3,
                            drafters=("model",))
        cut = dec.generate(PROMPT, max_tokens=60, sampling=sampling, draft_max=3,
                           drafters=("model",), stop=[rule])
        assert free.text.startswith(cut.text)
        assert free.tokens[:len(cut.tokens)] == cut.tokens
        if cut.finish_reason == "stop":
            fired += 1
            assert len(cut.tokens) < len(free.tokens) and cut.stop_string is None
    assert fired >= 2
