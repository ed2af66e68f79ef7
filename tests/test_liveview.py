"""`--show-drafts`: the live view read back from a terminal emulator (pyte), in a real
pseudo-terminal with real models, and on narrow screens with wide and split characters."""

from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
import sys
from pathlib import Path

import pytest
from rich.cells import get_character_cell_size

from specllama.cli.liveview import LiveDrafts
from specllama.engine.loop.events import (
    DraftProposed,
    RoundVerified,
    TargetToken,
    TextFlushed,
    TokensAccepted,
)
from specllama.engine.loop.textstream import TextStream

pyte = pytest.importorskip(
    "pyte", reason="reads the terminal's screen back with pyte: pip install -e '.[test]'")

SPECLLAMA = shutil.which("specllama") or str(Path(sys.executable).with_name("specllama"))
YELLOW = "brown"  # pyte's name for SGR 33


def screens(raw: str, rows: int, cols: int):
    """The screen after each write: the output split before every escape sequence."""
    screen = pyte.Screen(cols, rows)
    stream = pyte.Stream(screen)
    for piece in re.split(r"(?=\x1b)", raw):
        stream.feed(piece)
        yield screen


def cells(screen):
    """Every cell in reading order: (character, foreground, struck through)."""
    return [(screen.buffer[y][x].data, screen.buffer[y][x].fg, screen.buffer[y][x].strikethrough)
            for y in range(screen.lines) for x in range(screen.columns)]


def final_rows(raw: str, rows: int, cols: int) -> list[str]:
    """The rows that scrolled off the top, then the screen; no blank rows at the end."""
    screen = pyte.HistoryScreen(cols, rows, history=10_000)
    pyte.Stream(screen).feed(raw)
    gone = ["".join(line[x].data for x in range(cols)) for line in screen.history.top]
    out = [line.rstrip() for line in gone + screen.display]
    while out and not out[-1]:
        out.pop()
    return out


def test_show_drafts_in_a_real_terminal(tiny_target, tiny_draft, tmp_path):
    pexpect = pytest.importorskip(
        "pexpect", reason="drives a real terminal with pexpect: pip install -e '.[test]'")
    rows, cols = 60, 50  # the text, then the stats panel, all on one screen
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES")}
    env.update(TERM="xterm", SPECLLAMA_CACHE_DIR=str(tmp_path / "cache"))
    trace = tmp_path / "run.json"
    child = pexpect.spawn(
        SPECLLAMA,
        ["generate", "the cat sat on the", "--target", str(tiny_target), "--draft",
         str(tiny_draft), "--threads", "1", "--n-ctx", "256", "--raw", "--max-tokens", "60",
         "--temperature", "1", "--seed", "3", "--draft-max", "4", "--show-drafts",
         "--trace", str(trace)],
        env=env, encoding="utf-8", timeout=120, dimensions=(rows, cols),
    )
    child.expect(pexpect.EOF)
    raw = child.before
    child.close()
    assert child.exitstatus == 0, raw
    text = json.loads(trace.read_text())["generations"][0]["text"]
    rounds = json.loads(trace.read_text())["generations"][0]["rounds"]
    assert any(r["accepted"] < len(r["drafted"]) for r in rounds)

    # Some round with a rejection: its drafts were on screen as pending (blue) cells,
    # then struck through, followed by the target's correction (yellow).
    pending, verdict = [], False
    for screen in screens(raw, rows, cols):
        now = cells(screen)
        blue = "".join(c for c, fg, _ in now if fg == "blue")
        if blue:
            pending.append(blue)
        struck = [i for i, (_, _, s) in enumerate(now) if s]
        if struck and not verdict:
            after = now[struck[-1] + 1]
            tail = "".join(now[i][0] for i in struck)
            if after[1] == YELLOW and any(p.endswith(tail) for p in pending):
                verdict = True
    assert pending and verdict

    # At the end only the text remains, wrapped as the terminal wraps it.
    assert get_character_cell_size("x") == 1 and all(get_character_cell_size(c) == 1
                                                     for c in text if c != "\n")
    expected = [line[i:i + cols].rstrip() for line in text.split("\n")
                for i in range(0, max(len(line), 1), cols)]
    shown = final_rows(raw, rows, cols)
    start = next(i for i in range(rows) if shown[i:i + len(expected)] == expected)
    after = shown[start + len(expected):]
    assert after[0].startswith("finish: length"), shown
    assert not any("big-model steps" in line for line in shown)


# ------------------------------------------------- narrow screens, wide and split characters

PIECES = {
    10: b"ab", 11: "漢字".encode(), 12: b" c", 13: "😀".encode(), 14: b"\n", 15: b"xyz",
    16: b"\xc3", 17: b"\xa9",  # é split over two tokens
    18: b"long words ", 19: b"q", 20: "語".encode(), 21: b"\x1b[2J",  # a stray escape
    22: b"\tx",
}


def engine_events(rounds):
    """The events the engine yields for (drafts, accepted, target token) rounds."""
    text = TextStream(PIECES.__getitem__)
    for drafted, m, x in rounds:
        if drafted:
            yield DraftProposed(tuple(drafted))
        if m:
            yield TokensAccepted(tuple(drafted[:m]), text.feed(drafted[:m]))
        kind = "plain" if not drafted else ("bonus" if m == len(drafted) else "correction")
        yield TargetToken(x, text.feed([x]), kind)
        k = len(drafted)
        yield RoundVerified(tuple(drafted), ("model",) * k, m, x, kind, m + 1, (None,) * k,
                            (1.0,) * k, "model", 0.0, 0.0, 0.0)
    tail = text.flush()
    if tail:
        yield TextFlushed(tail)


def as_a_terminal_shows(text: str, cols: int) -> str:
    """Plain text the way xterm lays it out: a wide character that does not fit in
    the row moves to the next one (pyte would cut it), escapes are not text; a tab is
    spaces to the next stop."""
    out, col = [], 0
    for char in text.replace("\x1b", ""):
        for ch in " " * (8 - col % 8) if char == "\t" else char:
            if ch == "\n":
                out.append(ch)
                col = 0
                continue
            w = get_character_cell_size(ch)
            if col + w > cols:
                out.append(" " * (cols - col) if col < cols else "")
                col = 0
            out.append(ch)
            col += w
    return "".join(out)


@pytest.mark.parametrize("seed", range(3))
def test_verified_text_is_left_exactly_as_plain_output(seed):
    rng = random.Random(seed)
    ids = list(PIECES)
    rounds = []
    for _ in range(40):
        k = rng.randint(0, 4)
        drafted = [rng.choice(ids) for _ in range(k)]
        rounds.append((drafted, rng.randint(0, k), rng.choice(ids)))
    events = list(engine_events(rounds))
    for cols in range(4, 15):
        out = io.StringIO()
        view = LiveDrafts(out, PIECES.__getitem__, width=cols)
        for event in events:
            view.show(event)
        view.close()
        text = "".join(e.text for e in events if hasattr(e, "text"))
        assert view.printed == text
        rows = 12  # scrolls: the tail is found again by relative moves
        onlcr = out.getvalue().replace("\n", "\r\n")  # what a terminal's line discipline does
        assert final_rows(onlcr, rows, cols) == final_rows(
            as_a_terminal_shows(text, cols).replace("\n", "\r\n"), rows, cols
        ), cols


# ------------------------------------------------------------------ not on a terminal


def generate(*args):
    from click.testing import CliRunner

    from specllama.cli import cli

    return CliRunner().invoke(cli, ["generate", *map(str, args)])


def test_show_drafts_on_a_pipe_prints_the_plain_text(tiny_target, tiny_draft):
    args = ["the cat sat on the", "--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
            "--n-ctx", 256, "--raw", "--temperature", 0, "--max-tokens", 16, "--draft-max", 3]
    plain = generate(*args)
    shown = generate(*args, "--show-drafts", "--pace", 1)
    assert plain.exit_code == shown.exit_code == 0, shown.output
    assert shown.stdout == plain.stdout and "\x1b" not in shown.stdout


def test_pace_must_be_a_whole_number_of_milliseconds(tiny_target, tiny_draft):
    result = generate("hi", "--target", tiny_target, "--draft", tiny_draft, "--pace", -5)
    assert result.exit_code == 2
    assert result.stderr.startswith("specllama: error: Invalid value for '--pace'")
    assert result.stderr.count("\n") == 1 and result.stdout == ""


def test_chat_switches_the_view_with_set(tiny_target, tiny_draft, tmp_path):
    from click.testing import CliRunner

    from specllama.cli import cli

    lines = ["/set show_drafts on", "/set pace 0", "/set show_drafts maybe", "/set",
             "hello world", f"/save {tmp_path / 'chat.html'}"]
    result = CliRunner().invoke(
        cli, ["chat", "--target", str(tiny_target), "--draft", str(tiny_draft), "--threads", "1",
              "--n-ctx", "512", "--temperature", "0", "--max-tokens", "8", "--draft-max", "3"],
        input="\n".join(lines) + "\n",
    )
    assert result.exit_code == 0, result.output
    err = result.stderr
    assert "show_drafts = on" in err and "pace = 0" in err
    assert "error: show_drafts: expected on or off, got 'maybe'" in err
    assert re.search(r"show_drafts\s+on", err)
    assert "\x1b" not in result.stdout and result.stdout.strip()  # a pipe: plain text
    assert "saved the conversation" in err and (tmp_path / "chat.html").exists()


def test_chat_shows_drafts_in_a_real_terminal(tiny_target, tiny_draft, tmp_path):
    pexpect = pytest.importorskip(
        "pexpect", reason="drives a real terminal with pexpect: pip install -e '.[test]'")
    rows, cols = 30, 60
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES")}
    env.update(TERM="xterm", XDG_STATE_HOME=str(tmp_path / "state"), PROMPT_TOOLKIT_NO_CPR="1")
    child = pexpect.spawn(
        SPECLLAMA,
        ["chat", "--target", str(tiny_target), "--draft", str(tiny_draft), "--threads", "1",
         "--temperature", "0", "--max-tokens", "24", "--draft-max", "4"],
        env=env, encoding="utf-8", timeout=60, dimensions=(rows, cols),
    )
    child.logfile_read = io.StringIO()
    child.expect_exact("/help for commands")
    child.sendline("/set show_drafts on")
    child.expect_exact("show_drafts = on")
    child.sendline("the cat sat on the")
    child.expect(r"\d+ tok .*tok/s")
    child.sendline(f"/save {tmp_path / 'chat.json'}")
    child.expect_exact("saved the conversation")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    raw = child.logfile_read.getvalue()
    child.close()
    assert child.exitstatus == 0
    saw_pending = saw_footer = False
    for screen in screens(raw, rows, cols):
        saw_pending = saw_pending or any(fg == "blue" for _, fg, _ in cells(screen))
        saw_footer = saw_footer or any("big-model steps" in line for line in screen.display)
    assert saw_pending and saw_footer
    reply = json.loads((tmp_path / "chat.json").read_text())["messages"][1]["content"]
    shown = final_rows(raw, rows, cols)
    assert not any("big-model steps" in line for line in shown)
    assert " ".join(reply.split()) in " ".join(" ".join(shown).split())


def test_ctrl_c_leaves_only_the_text_and_still_writes_the_trace(tiny_target, tiny_draft,
                                                                 tmp_path):
    pexpect = pytest.importorskip(
        "pexpect", reason="drives a real terminal with pexpect: pip install -e '.[test]'")
    rows, cols = 30, 60
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES")}
    env.update(TERM="xterm")
    trace = tmp_path / "run.json"
    child = pexpect.spawn(
        SPECLLAMA,
        ["generate", "the cat sat on the", "--target", str(tiny_target), "--draft",
         str(tiny_draft), "--threads", "1", "--raw", "--max-tokens", "200", "--temperature", "0",
         "--draft-max", "4", "--pace", "150", "--trace", str(trace)],
        env=env, encoding="utf-8", timeout=60, dimensions=(rows, cols),
    )
    child.logfile_read = io.StringIO()
    child.expect_exact("big-model steps 2")
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130
    shown = final_rows(child.logfile_read.getvalue(), rows, cols)
    assert not any("big-model steps" in line for line in shown)
    gen = json.loads(trace.read_text())["generations"][0]
    assert gen["finish_reason"] == "interrupted"
    assert len(gen["rounds"]) == gen["stats"]["target_steps"] >= 2
    assert gen["text"].split()[0] in " ".join(shown)
