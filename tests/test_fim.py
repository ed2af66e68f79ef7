"""Fill in the middle without a server: the FIM tokens llama.cpp reads from a GGUF, the
prompt built as llama-server's format_prompt_infill builds it (order and budget), and the
editors' stops (n_indent, t_max_predict_ms) as text-level cuts that leave the target's
draws alone. tests/test_serve_infill.py asks a real server."""

from __future__ import annotations

import pytest
from tinymodels import FIM_TOKENS, write_tiny_model

from specllama import Deadline, Indent, SamplingParams, SpeculativeDecoder
from specllama.engine.llama import FimTokens, Vocabulary
from specllama.engine.loop.textstream import TextStream
from specllama.server import fim

# A model's FIM ids, made up: the pure functions never look them up.
PRE, SUF, MID, PAD, REP, SEP, BOS = 901, 902, 903, 904, 905, 906, 1
REPO_STYLE = FimTokens(PRE, SUF, MID, PAD, REP, SEP)
PLAIN_STYLE = FimTokens(PRE, SUF, MID)


def chars(text: str) -> list[int]:
    """A tokenizer of one token per character (its code point), for the pure functions."""
    return [ord(c) for c in text]


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("fim") / "fim.gguf", fim=True)


# ------------------------------------------------------------------ the vocabulary

def test_llama_cpp_reads_the_fim_tokens_from_the_gguf_keys(fim_model, tiny_target):
    vocab = Vocabulary(fim_model)
    ids = {key: vocab.tokenize(text, add_bos=False, special=True)[-1]
           for key, text in FIM_TOKENS.items()}
    assert vocab.fim == FimTokens(**ids) and vocab.fim.usable
    # llama.cpp makes the pad, repository and file-separator tokens ends of generation
    assert all(vocab.is_eog(ids[key]) for key in ("pad", "rep", "sep"))
    assert not vocab.is_eog(ids["pre"])
    assert Vocabulary(tiny_target).fim == FimTokens(None, None, None)
    assert not Vocabulary(tiny_target).fim.usable


# ------------------------------------------------------------------ the prompt

def test_the_prompt_is_in_llama_servers_order():
    parts = fim.Parts(prefix=chars("ab"), suffix=chars("yz"), middle=chars("m"),
                      extra=chars("EX"))
    got = fim.assemble(REPO_STYLE, parts, BOS, fim.Budget(64, 1000, 10))
    assert got == [*chars("EX"), BOS, PRE, *chars("ab"), *chars("m"), SUF, *chars("yz"), MID]
    assert fim.assemble(REPO_STYLE, parts, None, fim.Budget(64, 1000, 10))[2] == PRE


def test_the_extra_context_names_each_file_where_the_model_has_the_tokens():
    chunks = [fim.Chunk("a.py", "A"), fim.Chunk("b.py", "B")]
    assert fim.extra_tokens(REPO_STYLE, chunks, chars) == [
        REP, *chars("myproject\n"), SEP, *chars("a.py\n"), *chars("A"),
        SEP, *chars("b.py\n"), *chars("B"), SEP, *chars("filename\n")]
    snippet = chars("\n\n--- snippet ---\n\n")
    assert fim.extra_tokens(PLAIN_STYLE, chunks, chars) == [*snippet, *chars("A"),
                                                            *snippet, *chars("B")]
    assert fim.extra_tokens(PLAIN_STYLE, [], chars) == []


def test_a_long_prompt_keeps_the_prefix_end_and_the_suffix_start_three_to_one():
    """llama-server's split of n_batch: 3/4 to the prefix (its end), 1/4 less 2 and the
    prompt to the suffix (its start); the extra context keeps its end, in what the window
    leaves after the batch and twice n_predict."""
    prefix, suffix, extra = list(range(1000, 1200)), list(range(2000, 2200)), \
        list(range(3000, 3100))
    parts = fim.Parts(prefix, suffix, [7, 8], extra)
    got = fim.assemble(PLAIN_STYLE, parts, None, fim.Budget(n_batch=64, n_ctx=144, n_predict=20))
    n_extra = 144 - 64 - 2 * 20
    assert got == [*extra[-n_extra:], PRE, *prefix[-48:], 7, 8, SUF, *suffix[:16 - 4], MID]
    # a window with no room after the batch and the answer takes no extra context
    got = fim.assemble(PLAIN_STYLE, parts, None, fim.Budget(64, 100, 20))
    assert got[0] == PRE


def test_the_budget_is_llama_vims_batch_at_most_half_the_window():
    assert fim.Budget.of(4096, 512) == fim.Budget(1024, 4096, 512)
    assert fim.Budget.of(1024, 40) == fim.Budget(512, 1024, 40)


def test_the_prompt_in_a_models_tokens_keeps_the_files_in_order(fim_model):
    vocab = Vocabulary(fim_model)
    infill = fim.Infill("def f(x):\n    return", "\nprint(f(1))\n", " x",
                        (fim.Chunk("one.py", "first file"), fim.Chunk("two.py", "second")))
    shown = vocab.render(fim.prompt(vocab, infill, fim.Budget.of(1024, 40)))
    order = ["<fim:repo>", "myproject", "<fim:sep>", "one.py", "first file", "<fim:sep>",
             "two.py", "second", "<fim:sep>", "filename", "<s>", "<fim:pre>", "def f(x):",
             "return", " x", "<fim:suf>", "print(f(1))", "<fim:mid>"]
    at = 0
    for piece in order:  # each after the one before
        at = shown.find(piece, at)
        assert at >= 0, (piece, shown)
        at += len(piece)
    assert shown.endswith("<fim:mid>")


def test_text_is_never_read_as_special_tokens_but_the_prompt_is(fim_model):
    vocab = Vocabulary(fim_model)
    mid = vocab.fim.mid
    tokens = fim.prompt(vocab, fim.Infill("a <fim:mid> b", "<fim:mid>", "<fim:mid>"),
                        fim.Budget.of(1024, 40))
    # the FIM token that ends the prompt, and the prompt's own (llama-server parses it)
    assert tokens.count(mid) == 2 and tokens[-1] == mid


# ------------------------------------------------------------------ the stops

def fed(text: str, stops, cuts=()) -> tuple[str, TextStream]:
    """`text` through a TextStream in pieces, one byte a token; the text released."""
    stream = TextStream(lambda t: bytes([t]), stops)
    stream.begin()
    out, at = "", 0
    for cut in (*cuts, len(text)):
        out += stream.feed(list(text[at:cut].encode()))
        at = cut
    return out + stream.flush(), stream


@pytest.mark.parametrize("text, columns, expected", [
    ("x = 1\n    y = 2\n    z\nback()", 4, "x = 1\n    y = 2\n    z\n"),
    ("x\n  y\nz", 2, "x\n  y\n"),  # the cut keeps the short line's indentation ("")
    ("x\n    y\n  z", 4, "x\n    y\n  "),  # ... here two spaces, as llama-server leaves it
    ("x\n\ty\n z", 1, "x\n\ty\n z"),  # a tab is one column
    ("x\n    y\n\n    z", 4, "x\n    y\n"),  # a blank line is indented 0
    ("first line not judged\n    ok", 4, "first line not judged\n    ok"),
    ("no newline at all", 8, "no newline at all"),
])
def test_indent_cuts_the_first_line_less_indented(text, columns, expected):
    for i in range(len(text) + 1):  # wherever the tokens break
        out, stream = fed(text, [Indent(columns)], (i,))
        assert out == expected
        assert stream.ended_by == (Indent(columns) if expected != text else None)


def test_the_first_stop_of_any_kind_ends_the_text():
    out, stream = fed("a\nEND\n  b\nc", [Indent(2), "END"])
    assert (out, stream.ended_by, stream.matched) == ("a\n", "END", "END")
    out, stream = fed("a\n  b\nc END", [Indent(2), "END"])
    assert (out, stream.ended_by, stream.matched) == ("a\n  b\n", Indent(2), None)


def test_a_deadline_ends_the_text_after_the_next_newline():
    out, stream = fed("one\ntwo\nthree", [Deadline(0)], (2, 6))
    assert out == "one\n" and stream.ended_by == Deadline(0)
    out, stream = fed("one\ntwo\nthree", [Deadline(60_000)], (2, 6))
    assert out == "one\ntwo\nthree" and stream.ended_by is None


# ------------------------------------------------------------------ in the engine

def test_stops_cut_the_text_and_leave_the_draws_alone(tmp_path):
    """The same seed draws the same tokens with the rules as without, drafting or not:
    the text with them is the text without them cut where the rules say."""
    target = write_tiny_model(tmp_path / "t.gguf", fim=True, lines=3.0)
    draft = write_tiny_model(tmp_path / "d.gguf", fim=True, lines=3.0, noise=0.05)
    dec = SpeculativeDecoder.load(target=str(target), draft=str(draft), n_ctx=512)
    params = SamplingParams(temperature=1.0, seed=3)
    whole = dec.generate("The cat", max_tokens=60, sampling=params, draft_max=3)
    assert whole.text.count("\n") >= 2, whole.text
    expected, _ = fed(whole.text, [Indent(1)])
    cut = dec.generate("The cat", max_tokens=60, sampling=params, draft_max=3,
                       stop=[Indent(1)])
    assert cut.text == expected != whole.text  # lines begin unindented here: one is cut
    assert cut.tokens == whole.tokens[:len(cut.tokens)]
    assert (cut.finish_reason, cut.stopped_by, cut.stop_string) == ("stop", Indent(1), None)
    ended = dec.generate("The cat", max_tokens=60, sampling=params, draft_max=3,
                         stop=[Deadline(0)])
    assert ended.text == whole.text[:whole.text.index("\n") + 1]


def test_no_tokens_asked_puts_the_prompt_in_the_caches(fim_model):
    """max_tokens 0 (llama-server's n_predict 0): nothing drawn, the prompt evaluated, so
    the next call with the same start reuses it."""
    dec = SpeculativeDecoder.load(target=str(fim_model), n_ctx=256)
    prompt = dec.tokenize("hello world the cat and the dog")
    warm = dec.generate(prompt, max_tokens=0, keep_cache=True, draft_max=0)
    assert (warm.tokens, warm.text, warm.finish_reason) == ([], "", "length")
    then = dec.generate(prompt + dec.target.tokenize(" is", add_bos=False), max_tokens=2,
                        keep_cache=True, draft_max=0)
    assert then.stats.prompt_reused >= len(prompt) - 1
