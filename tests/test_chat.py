"""`specllama chat`: the session (prefix reuse, overflow, interruption, commands) on
tiny models with counted evaluations, the REPL in a real pseudo-terminal, piped use,
and a two-turn conversation with the real SmolLM2."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from tinymodels import CHATML

from specllama import (
    ContextOverflowError,
    Finished,
    InvalidParameterError,
    SpeculativeDecoder,
    TokensAccepted,
)
from specllama.cli.chat import ChatREPL, ChatSession, parse_setting
from specllama.engine.settings import LIVE_SETTINGS
from specllama.loading import RunSettings

SPECLLAMA = shutil.which("specllama") or str(Path(sys.executable).with_name("specllama"))
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]|\r")
# prompt_toolkit switches bracketed paste on each time it shows the prompt.
PROMPT, PROMPT_DONE = "\x1b[?2004h", "\x1b[?2004l"
COLOR_SGR = re.compile(r"\x1b\[[0-9;]*3[23]m")  # green or yellow foreground

# ChatML whose assistant turns are trimmed (as Llama 3's template trims every message).
CHATML_TRIM = CHATML.replace("message['content']", "(message['content'] | trim)")
# A template that refuses the system role (as Gemma's and Mistral's do).
NO_SYSTEM = (
    "{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}" + CHATML
)


def settings(n_ctx: int, **over) -> RunSettings:
    values = dict(
        temperature=0.0,
        max_tokens=12,
        draft_max=4,
        drafters=("model",),
        n_ctx=n_ctx,
        threads=1,
    )
    values.update(over)
    return RunSettings(**values)


@pytest.fixture
def open_session(tiny_target, tiny_draft):
    decoders = []

    def make(n_ctx=1024, target=None, draft=None, system=None, **over):
        dec = SpeculativeDecoder.load(
            target or tiny_target, draft or tiny_draft, n_ctx=n_ctx, n_threads=1, p_min=0.0
        )
        decoders.append(dec)
        return ChatSession(dec, settings(dec.n_ctx, **over), system=system)

    yield make
    for dec in decoders:
        dec.close()


def say(session: ChatSession, text: str) -> list:
    return list(session.reply(text))


def n_tokens(session: ChatSession, text: str) -> int:
    return len(session.decoder.target.tokenize(text, add_bos=False, special=True))


USER_LINES = [
    "hello world",
    "the cat and the dog",
    "what is that",
    "I see a cat",
    "how are you",
    "this is the one",
    "tell me some",
    "we like it",
    "you can do it",
    "they had one",
]


# ----------------------------------------------------------------- prefix reuse


def rest_tokens(session: ChatSession, line: str) -> int:
    """Tokens ChatML adds for one more turn: the end of the last reply, the new user
    message, the assistant header."""
    return n_tokens(
        session, f"<|im_end|>\n<|im_start|>user\n{line}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_each_turn_evaluates_only_its_new_tokens(open_session):
    s = open_session(n_ctx=2048, system="You are a cat.")
    eog = s.decoder.target.is_eog
    rows = []
    for i, line in enumerate(USER_LINES):
        before = list(s.committed)
        say(s, line)
        t = s.last_turn
        assert t.result is not None and t.result.tokens
        rows.append((t.prompt_tokens, t.reused, t.prompt_evaluated["target"]))
        if i == 0:
            assert t.reused == 0
            continue
        # The prompt is the token history (the previous prompt and the reply the model
        # really generated) plus the new turn; everything the caches held is reused.
        body = before[:-1] if eog(before[-1]) else before
        assert t.prompt_tokens == len(body) + rest_tokens(s, line), rows
        assert t.reused == len(before) - 1, rows
        # So turn n reads only the new user message and the template's glue around it
        # (plus the previous reply's last token, generated but never evaluated) --
        # nothing of the turns before, however long the conversation has become.
        assert t.prompt_evaluated["target"] == t.prompt_tokens - 1 - t.reused
        assert t.prompt_evaluated["target"] <= rest_tokens(s, line), rows
        # The draft may lag a few tokens behind the target, never more than one round.
        assert t.prompt_evaluated["draft"] <= t.prompt_evaluated["target"] + 5, rows
        assert s.cache_report().consistent
    assert rows[-1][1] > rows[1][1] + 8 * 12  # the reused prefix grew every turn ...
    assert max(r[2] for r in rows[1:]) <= 30  # ... while the work per turn did not
    assert rows[-1][0] > 5 * rows[-1][2]


def test_token_history_survives_a_trimming_template(open_session, tiny_model_factory):
    target = tiny_model_factory(seed=0, chat_template=CHATML_TRIM)
    draft = tiny_model_factory(seed=0, noise=0.05, noise_seed=1, chat_template=CHATML_TRIM)
    s = open_session(target=target, draft=draft)
    for line in USER_LINES[:4]:
        say(s, line)
    t = s.last_turn
    assert t.reused > 60 and t.prompt_evaluated["target"] <= rest_tokens(s, USER_LINES[3])


def test_cached_reply_equals_a_fresh_reading(open_session):
    """Both caches are consistent: continuing on them gives exactly what reading the
    whole token history from scratch gives (greedy)."""
    a, b = open_session(max_tokens=20), open_session(max_tokens=20)
    for line in USER_LINES[:3]:
        say(a, line)
        say(b, line)
    assert a.committed == b.committed
    b.decoder.reset()
    say(a, USER_LINES[3])
    say(b, USER_LINES[3])
    assert b.last_turn.reused == 0 and a.last_turn.reused > 30
    assert a.last_turn.result.tokens == b.last_turn.result.tokens


def test_interrupted_reply_keeps_partial_text_and_consistent_caches(open_session):
    a, b = open_session(max_tokens=400), open_session(max_tokens=400)
    say(a, "hello world")
    say(b, "hello world")
    events = a.reply("the cat and the dog")
    seen = 0
    for event in events:
        if isinstance(event, TokensAccepted):
            seen += len(event.tokens)
            if seen >= 6:
                break
    events.close()  # what the REPL does on Ctrl-C
    reply = a.messages[-1]
    assert reply.role == "assistant" and reply.finish_reason == "interrupted"
    assert reply.content and a.last_turn.finish_reason == "interrupted"
    assert 6 <= len(a.last_turn.result.tokens) < 400
    assert a.cache_report().consistent
    assert [m.role for m in a.messages] == ["user", "assistant"] * 2

    # b gets the same history without ever having had the interrupted stream.
    b.messages.append(type(reply)("user", "the cat and the dog"))
    b.messages.append(reply)
    b._anchor, b.committed = a._anchor, list(a.committed)
    b.decoder.reset()
    for session in (a, b):
        session.set("max_tokens", 30)  # far from float-noise ties
    say(a, "what is that")
    say(b, "what is that")
    assert a.last_turn.result.tokens == b.last_turn.result.tokens
    assert a.last_turn.prompt_evaluated["target"] <= rest_tokens(a, "what is that")


def test_interrupt_before_the_first_token_withdraws_the_message(open_session):
    s = open_session()
    say(s, "hello world")
    before = [m.content for m in s.messages]
    events = s.reply("the cat")
    events.close()  # never started: nothing recorded, nothing half-done
    assert [m.content for m in s.messages] == before
    gen = s.reply("the cat")
    next(gen)  # PromptEvaluated: the prompt is in the caches, no token yet
    with pytest.raises(KeyboardInterrupt):
        gen.throw(KeyboardInterrupt)  # Ctrl-C arriving in the REPL loop
    assert [m.content for m in s.messages] == before
    assert s.cache_report().consistent
    say(s, "the cat")
    assert len(s.messages) == 4


# ------------------------------------------------------------- context overflow


def test_overflow_drops_oldest_turns_keeps_system_and_continues(open_session):
    s = open_session(n_ctx=256, system="You are a cat.", max_tokens=12)
    n_ctx = s.decoder.n_ctx
    trims = []
    for i in range(14):
        line = USER_LINES[i % len(USER_LINES)] + " the cat and the dog"
        events = say(s, line)
        t = s.last_turn
        assert isinstance(events[-1], Finished)
        assert t.prompt_tokens + min(12, n_ctx // 4) <= n_ctx
        msgs = s.chat_messages()
        assert msgs[0] == {"role": "system", "content": "You are a cat."}
        assert [m["role"] for m in msgs[1:]] == ["user", "assistant"] * ((len(msgs) - 1) // 2)
        if t.trimmed is not None:
            assert events[0] is t.trimmed
            assert t.trimmed.tokens_after < t.trimmed.tokens_before
            # the remaining conversation is re-read once (counted, not timed) ...
            assert t.prompt_evaluated["target"] > t.prompt_tokens // 2
            trims.append(i)
        elif i > 0 and trims and i - 1 == trims[-1]:
            # ... and the turn after that is cheap again.
            assert t.prompt_evaluated["target"] <= rest_tokens(s, line)
        assert s.cache_report().consistent
    assert trims, "the conversation never outgrew 256 tokens?"
    assert s.first_kept > 0
    # Trimming leaves room (a quarter of the window), so it is not needed every turn.
    assert len(trims) < 14 - trims[0] - 1


def test_a_message_longer_than_the_context_is_refused(open_session):
    s = open_session(n_ctx=256)  # llama.cpp rounds n_ctx up to a multiple of 256
    say(s, "hello world")
    with pytest.raises(ContextOverflowError, match="context window holds 256"):
        s.reply(" ".join(["hello world"] * 200))
    assert len(s.messages) == 2
    say(s, "the cat")
    assert len(s.messages) == 4


# -------------------------------------------------------------------- templates


def test_no_chat_template_falls_back_to_a_plain_format(open_session, tiny_model_factory):
    target = tiny_model_factory(seed=0, chat_template=None)
    draft = tiny_model_factory(seed=0, noise=0.05, noise_seed=1, chat_template=None)
    s = open_session(target=target, draft=draft, system="Be nice.")
    assert s.plain_format and "no chat template" in s.notice
    say(s, "hello")
    say(s, "the cat")
    text = s.last_turn.prompt_text
    assert text.startswith("Be nice.\n\nUser: hello\nAssistant: ")
    assert text.endswith("User: the cat\nAssistant:")
    assert s.last_turn.reused > 5


def test_template_without_a_system_role_gets_it_in_the_first_message(
    open_session, tiny_model_factory
):
    target = tiny_model_factory(seed=0, chat_template=NO_SYSTEM)
    draft = tiny_model_factory(seed=0, noise=0.05, noise_seed=1, chat_template=NO_SYSTEM)
    s = open_session(target=target, draft=draft, system="Be nice.")
    assert s.fold_system and s.notice is None
    say(s, "hello")
    assert s.last_turn.prompt_text.startswith("<|im_start|>user\nBe nice.\n\nhello<|im_end|>")


# --------------------------------------------------------------------- commands


def test_set_takes_every_live_setting_of_the_table(open_session):
    s = open_session()
    before = s.settings
    for name in LIVE_SETTINGS:
        value = getattr(before, name)
        typed = ",".join(value) if isinstance(value, tuple) else str(value)
        assert s.set(name, typed)[0] == name
    assert s.settings == before


@pytest.mark.parametrize("names", ["model", "hybrid", "lookup>model"])
def test_set_refuses_model_drafts_without_a_draft_model(open_session, names):
    s = open_session(draft="lookup", drafters=("lookup",))
    with pytest.raises(InvalidParameterError, match="need a draft model, but this pair has none"):
        s.set("drafters", names)
    assert s.settings.drafters == ("lookup",)


def test_set_validates_like_the_config_file(open_session):
    s = open_session()
    assert s.set("temperature", "0.7") == ("temperature", 0.7)
    assert s.settings.sampling.temperature == 0.7
    assert s.set("top-p", "0.9")[1] == 0.9 and s.settings.sampling.top_p == 0.9
    assert s.set("max_tokens", "5") == ("max_tokens", 5)
    assert s.set("draft_max", "auto") == ("draft_max", "auto")
    assert s.set("draft_max", "2") == ("draft_max", 2)
    assert s.set("seed", "3")[1] == 3 and s.set("seed", "none")[1] is None
    assert s.set("drafters", "hybrid") == ("drafters", ("lookup", "model"))
    assert s.set("draft_mode", "lookup>model") == ("drafters", ("lookup>model",))
    assert s.set("p-min", "0.4") == ("p_min", 0.4) and s.decoder.p_min == 0.4
    assert s.settings.as_dict()["p_min"] == 0.4
    for name, value, fragment in [
        ("top_p", "1.5", "top_p: must be in (0, 1], got 1.5"),
        ("temperature", "warm", "temperature: must be a number"),
        ("max_tokens", "0", "max_tokens: must be >= 1"),
        ("draft_max", "99", "draft_max: must be in [0, 64]"),
        ("drafters", "psychic", "drafters: must be some of lookup, model, lookup>model"),
        ("n_ctx", "100", "restart with --n-ctx"),
        ("temprature", "1", "did you mean temperature"),
        ("top_k", "", "needs a value"),
        ("p_min", "2", "p_min: must be in [0, 1]"),
    ]:
        with pytest.raises(InvalidParameterError, match=re.escape(fragment)):
            s.set(name, value)
    say(s, "hello")  # settings in effect
    assert len(s.last_turn.result.tokens) <= 5
    with pytest.raises(InvalidParameterError):
        parse_setting("min_p", "-1")


def test_reset_system_and_save(open_session, tmp_path):
    s = open_session(system="You are a cat.")
    say(s, "hello world")
    say(s, "the cat")
    s.reset()
    assert s.messages == []
    say(s, "what is that")
    # the system prompt is still in both caches after /reset
    assert s.last_turn.reused >= n_tokens(s, "<|im_start|>system\nYou are a cat.")
    s.set_system("You are a dog.")
    say(s, "I see a cat")
    assert s.chat_messages()[0]["content"] == "You are a dog."

    kind = s.save(tmp_path / "t.json")
    data = json.loads((tmp_path / "t.json").read_text())
    assert kind == "JSON" and data["system"] == "You are a dog."
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"] * 2
    assert data["messages"][0]["content"] == "what is that"
    assert data["messages"][1]["finish_reason"] in ("eos", "length")
    assert data["settings"]["max_tokens"] == 12 and data["stats"]["tokens"] > 0
    assert s.save(tmp_path / "t.md") == "Markdown"
    md = (tmp_path / "t.md").read_text()
    assert "## System\n\nYou are a dog." in md and "## User\n\nI see a cat" in md
    with pytest.raises(InvalidParameterError, match="cannot write"):
        s.save(tmp_path / "missing" / "dir" / "t.md")


def run_repl(session, lines):
    out, err = io.StringIO(), io.StringIO()
    repl = ChatREPL(session, out=out, err=Console(file=err, width=200), color=False)
    code = repl.run(lines)
    return code, out.getvalue(), err.getvalue()


def test_repl_commands_and_hints(open_session, tmp_path):
    s = open_session()
    path = tmp_path / "chat.md"
    code, out, err = run_repl(s, [
        "/help", "hello world", "/sett temperature 1", "/set temperature 0.5", "/set top_p 7",
        "/frobnicate", "/system Be brief.", "/system", "the cat", "/stats", f"/save {path}",
        "/debug-cache", "/reset", "/exit", "never sent",
    ])
    assert code == 0
    assert "/reset" in err and "/save FILE" in err  # help
    assert "unknown command /sett; did you mean /set?" in err
    assert "unknown command /frobnicate; /help lists the commands" in err
    assert "temperature = 0.5" in err and s.settings.sampling.temperature == 0.5
    assert "error: top_p: must be in (0, 1], got 7" in err
    assert "Be brief." in err and "consistent=True" in err
    assert "session: 2 replies" in err and "tok/s" in err
    assert len(out.strip().splitlines()) >= 2  # the two replies
    assert "## User\n\nthe cat" in path.read_text()
    assert s.messages == [] and s.replies == 2


# ----------------------------------------------------------- through a terminal


def chat_env(tmp_path, **extra):
    env = dict(os.environ)
    env.pop("NO_COLOR", None)
    env.update(
        XDG_STATE_HOME=str(tmp_path / "state"),  # prompt history goes here
        PROMPT_TOOLKIT_NO_CPR="1",  # pexpect does not answer cursor-position queries
        TERM="xterm",
        COLUMNS="120",
        LINES="40",
    )
    env.update(extra)
    return env


def spawn_chat(args, env):
    pexpect = pytest.importorskip(
        "pexpect", reason="drives a real terminal with pexpect: pip install -e '.[test]'")
    child = pexpect.spawn(
        SPECLLAMA, ["chat", *map(str, args)], env=env, encoding="utf-8",
        timeout=60, dimensions=(40, 120),
    )
    child.logfile_read = io.StringIO()
    return child


def plain(text: str) -> str:
    return ANSI.sub("", text)


def test_repl_in_a_pseudo_terminal(tiny_target, tiny_draft, tmp_path):
    args = ["--target", tiny_target, "--draft", tiny_draft, "--threads", 1, "--n-ctx", 4096,
            "--temperature", 0, "--max-tokens", 12, "--draft-max", 3]
    child = spawn_chat(args, chat_env(tmp_path, NO_COLOR="1"))
    log = child.logfile_read

    child.expect_exact("/help for commands")
    child.expect_exact(PROMPT)
    child.sendline("hello world")
    child.expect(r"\d+ tok .*tok/s")
    child.expect_exact(PROMPT)
    child.sendline("/set max_tokens 2000")
    child.expect_exact("max_tokens = 2000")
    child.expect_exact(PROMPT)
    child.sendline("/bogus")
    child.expect_exact("unknown command /bogus")
    child.expect_exact(PROMPT)

    # A long reply, stopped with Ctrl-C once it is under way.
    child.sendline("the cat and the dog")
    child.expect_exact("the cat and the dog")
    child.expect(re.escape(PROMPT_DONE) + r"[^\x1b\r\n]{8}")  # the reply is under way
    child.sendintr()
    child.expect_exact("(interrupted)")
    child.expect_exact(PROMPT)
    child.sendline("/debug-cache")
    child.expect(r"consistent=(True|False)")
    assert child.match.group(1) == "True"
    child.expect_exact(PROMPT)

    # Ctrl-C at the prompt clears the line; the next one is sent as typed.
    child.send("garbage that is never sent")
    child.sendintr()
    child.expect_exact(PROMPT)
    child.sendline("/set max_tokens 12")
    child.expect_exact(PROMPT)
    child.sendline("what is that")
    child.expect(r"\d+ tok .*tok/s")
    child.expect_exact(PROMPT)
    child.send("\x1b[A")  # Up: the last line comes back for editing
    child.expect_exact("what is that")
    child.send("\r")
    child.expect(r"\d+ tok .*tok/s")
    child.expect_exact(PROMPT)
    child.sendline(f"/save {tmp_path / 'chat.json'}")
    child.expect_exact("saved the conversation")
    child.expect_exact(PROMPT)
    child.sendeof()  # Ctrl-D: session stats, clean exit
    child.expect_exact("session: 4 replies")
    child.expect(pexpect_eof())
    child.close()
    assert child.exitstatus == 0, plain(log.getvalue())

    transcript = plain(log.getvalue())
    assert "Traceback" not in transcript
    assert not COLOR_SGR.search(log.getvalue())  # NO_COLOR
    assert "garbage" not in json.dumps(json.loads((tmp_path / "chat.json").read_text()))
    data = json.loads((tmp_path / "chat.json").read_text())
    users = [m["content"] for m in data["messages"] if m["role"] == "user"]
    assert users == ["hello world", "the cat and the dog", "what is that", "what is that"]
    replies = [m for m in data["messages"] if m["role"] == "assistant"]
    assert replies[1]["finish_reason"] == "interrupted" and replies[1]["content"]
    assert replies[1]["content"].split()[0] in transcript  # the partial text was shown
    assert replies[0]["content"].split()[0] in transcript
    assert (tmp_path / "state" / "specllama" / "chat_history").read_text().count("+hello") == 1


def pexpect_eof():
    import pexpect

    return pexpect.EOF


def test_repl_colours_replies_on_a_terminal(tiny_target, tiny_draft, tmp_path):
    args = ["--target", tiny_target, "--draft", tiny_draft, "--threads", 1,
            "--temperature", 0, "--max-tokens", 12, "--draft-max", 3]
    child = spawn_chat(args, chat_env(tmp_path))
    child.expect_exact(PROMPT)
    child.sendline("hello world")
    child.expect(r"tok/s")
    child.expect_exact(PROMPT)
    child.sendline("/exit")
    child.expect(pexpect_eof())
    child.close()
    assert child.exitstatus == 0
    assert COLOR_SGR.search(child.logfile_read.getvalue())


# ---------------------------------------------------------------------- piped


def test_piped_chat_answers_and_exits(tiny_target, tiny_draft, tmp_path):
    args = [SPECLLAMA, "chat", "--target", tiny_target, "--draft", tiny_draft, "--threads", "1",
            "--temperature", "0", "--max-tokens", "8", "--draft-max", "3"]
    env = chat_env(tmp_path)
    one = subprocess.run(args, input="hi\n", capture_output=True, text=True, env=env,
                         timeout=120)
    assert one.returncode == 0, one.stderr
    assert len(one.stdout.strip().splitlines()) == 1 and "\x1b[" not in one.stdout
    assert "tok/s" in one.stderr and "session: 1 reply" in one.stderr
    assert "Traceback" not in one.stderr

    two = subprocess.run(args, input="hi\n/set top_p 2\n/nope\nthe cat\n", capture_output=True,
                         text=True, env=env, timeout=120)
    assert two.returncode == 0, two.stderr
    assert "error: top_p: must be in (0, 1], got 2" in two.stderr
    assert "unknown command /nope" in two.stderr
    assert "session: 2 replies" in two.stderr
    assert two.stdout.startswith(one.stdout)  # same first turn (greedy)


def test_bad_flags_are_one_line_errors(tiny_target, tmp_path):
    r = subprocess.run([SPECLLAMA, "chat", "--target", str(tiny_target), "--draft", "lookup",
                        "--top-p", "3"], input="hi\n", capture_output=True, text=True,
                       env=chat_env(tmp_path), timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "specllama: error: --top-p: must be in (0, 1], got 3.0"
    ]


# --------------------------------------------------------------- the real model


@pytest.mark.slow
def test_two_turns_with_smollm2(smollm2_path):
    """What holds on any CPU (llama.cpp's numerics differ between machines, so the words
    do too): the template is applied to both turns, each reply is non-empty and ends for a
    stated reason, turn 2 reads only its new tokens, and the speculative replies are the
    target's own greedy replies on this machine."""
    from specllama.models.config import find_and_load_config
    from specllama.models.sources import resolve_pair

    target, draft = resolve_pair(find_and_load_config().pair("smollm2"))
    dec = SpeculativeDecoder.load(target, draft, n_ctx=1024, n_threads=2, p_min=0.0)
    replies: dict[int, list] = {}
    try:
        for draft_max in (3, 0):
            s = ChatSession(dec, settings(dec.n_ctx, max_tokens=48, draft_max=draft_max))
            assert "<|im_start|>" in s.template and s.notice is None
            say(s, "Hi! What is your name?")
            first = s.last_turn
            first_prompt = dec.target.tokenize_chat(first.prompt_text)
            say(s, "What is 2 + 2?")
            second = s.last_turn
            replies[draft_max] = [m.content for m in s.messages if m.role == "assistant"]
            assert second.prompt_text.count("<|im_start|>user\n") == 2  # ChatML, both turns
            for turn in (first, second):
                assert turn.finish_reason in ("eos", "length"), turn
            assert all(r.strip() for r in replies[draft_max]), replies
            # Turn 2 read the new question and ChatML's glue, not turn 1 again.
            assert second.reused >= len(first_prompt), second
            assert second.prompt_evaluated["target"] <= 25, second
    finally:
        dec.close()
    assert replies[3] == replies[0]


def test_the_remote_decoder_keeps_the_engine_process_caches_in_step(tiny_target, tiny_draft):
    """What chat asks of a decoder in an engine process (a remote target's chat): a
    stream, each model's cache cut back alone, the cache report, p_min, the comparison."""
    from specllama import SamplingParams
    from specllama.cli.chat.remote import RemoteDecoder
    from specllama.loading import RunOptions
    from specllama.policy.compare import Comparison

    remote = RemoteDecoder(RunOptions(target=str(tiny_target), draft=str(tiny_draft),
                                      flags=(("threads", 1), ("n_ctx", 256))))
    try:
        tokens = remote.target.tokenize("the cat", add_bos=True, special=True)
        stream = remote.stream(tokens, max_tokens=12, sampling=SamplingParams(temperature=0),
                               draft_max=3, drafters=("model",))
        events = list(stream)
        assert stream.result is not None and events
        history = tokens + list(stream.result.tokens)
        assert remote.evaluated["target"] > 0
        report = remote.cache_report(history)
        assert report.consistent and report.history == len(history)
        remote.target.sync_to(tokens)  # the target alone is cut back
        report = remote.cache_report(tokens)
        assert report.target == len(tokens) and report.draft > len(tokens)
        remote.draft.sync_to(tokens)
        assert remote.cache_report(tokens).consistent
        remote.p_min = 0.5
        assert isinstance(remote.compare(stream.result.stats), Comparison)
    finally:
        remote.close()
