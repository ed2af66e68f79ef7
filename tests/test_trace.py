"""The trace: per-round records built from the engine's events, as JSON, and as a page
read back from real headless Chromium."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from specllama import SamplingParams, SpeculativeDecoder
from specllama.cli import cli
from specllama.cli.trace import TraceRecorder

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]


@pytest.fixture(scope="module")
def decoder(tiny_target, tiny_draft):
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft, n_ctx=256, n_threads=1)
    yield dec
    dec.close()


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def replayed_tokens(rounds):
    """The output as the rounds tell it: accepted drafts, then the target's token."""
    out = []
    for r in rounds:
        shown = min(r["accepted"], r["emitted"])
        out += r["drafted"][:shown]
        if r["emitted"] > shown:
            out.append(r["token"])
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_rounds_reproduce_the_stats(decoder, temperature):
    recorder = TraceRecorder(decoder.target.piece)
    params = SamplingParams(temperature=temperature, seed=5)
    stream = decoder.stream("the cat sat on the", max_tokens=48, sampling=params, draft_max=4)
    for event in stream:
        recorder.feed(event)
    (gen,) = recorder.generations
    stats, rounds = gen.stats, gen.rounds
    assert len(rounds) == stats.target_steps
    assert sum(r["accepted"] for r in rounds) == stats.accepted
    assert sum(len(r["drafted"]) for r in rounds) == stats.drafted
    assert sum(r["emitted"] for r in rounds) == stats.tokens
    assert stream.result is not None
    assert replayed_tokens(rounds) == stream.result.tokens
    assert any(r["accepted"] < len(r["drafted"]) for r in rounds), "no rejection to look at"
    for r in rounds:
        k, m = len(r["drafted"]), r["accepted"]
        assert len(r["p"]) == len(r["q"]) == len(r["drafted_text"]) == k
        assert r["kind"] == ("plain" if k == 0 else "bonus" if m == k else "correction")
        assert r["draft_s"] >= 0 and r["target_s"] > 0 and r["seconds"] > 0
        for i, (p, q) in enumerate(zip(r["p"], r["q"])):
            assert 0 < q <= 1
            if i > m:
                assert p is None  # after the first rejection the target's row is never read
            elif temperature == 0:
                assert q == 1 and p == (1.0 if i < m else 0.0)
            else:
                assert 0 <= p <= 1
    # Exactly what the JSON file holds.
    data = json.loads(json.dumps(recorder.to_dict()))
    assert data["format"] == "specllama-trace/1"
    assert data["generations"][0]["rounds"] == rounds
    assert data["stats"]["accepted"] == stats.accepted


def test_generate_writes_a_json_trace(tiny, tmp_path):
    path = tmp_path / "run.json"
    result = run("generate", "the cat sat on the", *tiny, "--raw", "--json", "--max-tokens", 40,
                 "--temperature", 1.0, "--seed", 3, "--draft-max", 4, "--trace", path)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert result.stderr.strip() == f"trace (JSON) written to {path}"
    trace = json.loads(path.read_text())
    (gen,) = trace["generations"]
    stats = printed["stats"]
    assert len(gen["rounds"]) == stats["target_steps"]
    assert sum(r["accepted"] for r in gen["rounds"]) == stats["accepted"]
    assert replayed_tokens(gen["rounds"]) == printed["tokens"]
    assert gen["text"] == printed["text"]
    assert trace["settings"]["seed"] == 3 and trace["settings"]["draft_max"] == 4


@pytest.mark.parametrize("name", ["run.txt", "run"])
def test_a_trace_must_be_html_or_json(tiny, name, tmp_path):
    result = run("generate", "hi", *tiny, "--trace", tmp_path / name)
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"specllama: error: a trace file must end in .html or .json, got '{tmp_path / name}'"
    )
    assert result.stdout == ""


def test_a_trace_in_a_missing_folder_is_refused_before_loading(tiny, tmp_path):
    result = run("generate", "hi", *tiny, "--trace", tmp_path / "nope" / "t.html")
    assert result.exit_code == 2
    assert "no folder" in result.stderr and result.stderr.count("\n") == 1


# ------------------------------------------------------------------ the page, in Chromium


@pytest.fixture(scope="session")
def chromium():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed (.ci/run installs it: apt-get install chromium)")
    return path


def open_in_chromium(chromium: str, page: Path, tmp_path: Path,
                     fragment: str = "") -> tuple[str, list[str]]:
    """The DOM after the page's scripts ran (timers too: a minute of virtual time passes
    at once), and whatever it logged to the console."""
    home = tmp_path / "chromium-home"
    env = dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_CACHE_HOME=str(home / ".cache"))
    done = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={home / 'profile'}",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=60000", "--dump-dom",
         page.as_uri() + fragment],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


class Chips(HTMLParser):
    """Token chips by kind, their hover titles, the stat boxes' values."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: list[str] = []
        self.titles: list[str] = []
        self.stats: dict[str, str] = {}
        self.root: dict[str, str | None] = {}
        self._stat: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "html":
            self.root = a
        if tag == "span" and "token" in classes:
            self.kinds.append(next(c for c in classes if c in ("accepted", "corrected",
                                                                "rejected", "draft")))
            self.titles.append(a.get("title") or "")
        if a.get("id", "").startswith("stat-"):
            self._stat = a["id"]

    def handle_data(self, data):
        if self._stat:
            self.stats[self._stat] = self.stats.get(self._stat, "") + data

    def handle_endtag(self, tag):
        self._stat = None


def test_trace_page_in_headless_chromium(tiny, chromium, tmp_path):
    page = tmp_path / "run.html"
    result = run("generate", "the cat sat on the", *tiny, "--raw", "--json", "--max-tokens", 40,
                 "--temperature", 1.0, "--seed", 3, "--draft-max", 4, "--trace", page)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    stats = out["stats"]
    assert out["finish_reason"] == "length"  # no EOS cut a round short: counts are exact
    assert stats["drafted"] > stats["accepted"] > 0

    html = page.read_text()
    assert not re.search(r"(src|href)\s*=|url\(|@import", html)  # nothing to fetch

    dom, console = open_in_chromium(chromium, page, tmp_path)
    assert console == []
    chips = Chips()
    chips.feed(dom)
    assert chips.root.get("data-ready") == "1"  # the page's script ran to its end
    assert chips.kinds.count("accepted") == stats["accepted"]
    assert chips.kinds.count("corrected") == stats["target_steps"]
    assert chips.kinds.count("rejected") == stats["drafted"] - stats["accepted"]
    assert chips.kinds.count("draft") == 0
    assert chips.stats == {
        "stat-target": str(stats["target_steps"]),
        "stat-speedup": f"{stats['tokens_per_step']:.2f}×",
        "stat-tokens": str(stats["tokens"]),
    }
    accepted = chips.titles[chips.kinds.index("accepted")]
    assert re.fullmatch(r"round \d+ · draft position \d+ · accepted · p [01]\.\d{3} · "
                        r"q [01]\.\d{3}", accepted), accepted
    assert any("rejected" in t for t in chips.titles)

    # The replay (page#replay starts it) ends where the page began.
    dom, console = open_in_chromium(chromium, page, tmp_path, "#replay")
    assert console == []
    replayed = Chips()
    replayed.feed(dom)
    assert replayed.root.get("data-replayed") == "1"
    assert (replayed.kinds, replayed.stats) == (chips.kinds, chips.stats)


def test_chat_saves_the_trace_page(decoder, chromium, tmp_path):
    from specllama.cli.chat import ChatSession
    from specllama.loading import RunSettings

    settings = RunSettings(temperature=0.0, max_tokens=12,
                           draft_max=3, drafters=("model",), n_ctx=256, threads=1,
                           target="t.gguf", draft="d.gguf")
    session = ChatSession(decoder, settings)
    for message in ("hello world", "the cat <b>and</b> the dog"):
        for _ in session.reply(message):
            pass
    assert session.save(tmp_path / "chat.html") == "HTML"
    dom, console = open_in_chromium(chromium, tmp_path / "chat.html", tmp_path)
    assert console == []
    chips = Chips()
    chips.feed(dom)
    totals = session.totals
    assert chips.stats["stat-tokens"] == str(totals.tokens)
    assert chips.stats["stat-target"] == str(totals.target_steps)
    assert chips.kinds.count("accepted") + chips.kinds.count("corrected") == totals.tokens
    assert "the cat &lt;b&gt;and&lt;/b&gt; the dog" in dom  # the user's words, escaped


def test_a_stopped_run_still_adds_up(tiny, tmp_path):
    path = tmp_path / "run.json"
    result = run("generate", "the cat sat on the", *tiny, "--raw", "--json", "--max-tokens", 60,
                 "--temperature", 1.0, "--seed", 4, "--draft-max", 4, "--stop", "e",
                 "--trace", path)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["finish_reason"] == "stop"
    (gen,) = json.loads(path.read_text())["generations"]
    assert len(gen["rounds"]) == printed["stats"]["target_steps"]
    assert sum(r["accepted"] for r in gen["rounds"]) == printed["stats"]["accepted"]
    assert gen["text"] == printed["text"] and "e" not in gen["text"]


def test_drafts_only_the_draft_model_can_spell(tiny_model_factory):
    # An uneven pair: the draft's vocabulary has ids the target lacks. A rejected draft
    # of one must still show (the target's llama.cpp would abort on its id).
    from conftest import DRAFT_NOISE

    from specllama.cli.liveview import LiveDrafts
    from specllama.cli.trace import token_piece

    dec = SpeculativeDecoder.load(
        tiny_model_factory(seed=0),
        tiny_model_factory(seed=0, noise=DRAFT_NOISE, noise_seed=1, extra_tokens=64),
        n_ctx=256, n_threads=1,
    )
    try:
        recorder = TraceRecorder(token_piece(dec))
        foreign = []
        for seed in range(200):
            view = LiveDrafts(io.StringIO(), token_piece(dec), width=40)
            for event in dec.stream("the cat sat on the", max_tokens=3, draft_max=3,
                                    sampling=SamplingParams(temperature=1.0, seed=seed)):
                recorder.feed(event)
                view.show(event)
            view.close()
            foreign = [t for r in recorder.generations[-1].rounds for t in r["drafted"]
                       if t >= dec.target.n_vocab]
            if foreign:
                break
        assert foreign, "no draft-only id was proposed"
        rounds = recorder.generations[-1].rounds
        assert all(r["drafted"].index(t) >= r["accepted"] for r in rounds for t in foreign
                   if t in r["drafted"])  # the target never accepts an id it lacks
    finally:
        dec.close()
