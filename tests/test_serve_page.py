"""`specllama serve`'s live page (GET /) in headless Chromium, driven through the
DevTools protocol, against a real server on the tiny pair; and the round-event stream
it reads (POST /v1/rounds) from a plain HTTP client."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from servers import starting
from websockets.sync.client import connect

KEY = "page-test-key"
# A prompt that repeats itself (tests/test_serve_inputs.py's), for lookup drafts.
REPEATS = "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat"


@pytest.fixture(scope="module")
def start(tiny_target, tiny_draft, tmp_path_factory):
    with starting(tmp_path_factory, "page", "--target", tiny_target, "--draft", tiny_draft,
                  "--threads", 1, "--n-ctx", 1024, "--draft-max", 3, "--temperature", 0.8,
                  "--max-tokens", 40) as make:
        yield make


@pytest.fixture(scope="module")
def server(start):
    return start("--parallel", 2)


@pytest.fixture(scope="module")
def keyed(start):
    return start("--api-key", KEY)


# ------------------------------------------------------------------ Chromium over CDP
class Browser:
    """Headless Chromium and one DevTools connection; tabs are sessions on it."""

    def __init__(self, path: str, home: Path) -> None:
        env = dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
                   XDG_CACHE_HOME=str(home / ".cache"))
        self.proc = subprocess.Popen(
            [path, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--window-size=1000,1000", "--remote-debugging-port=0",
             f"--user-data-dir={home / 'profile'}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, env=env)
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                break
            found = re.search(r"DevTools listening on (ws://\S+)", line)
            url = found.group(1) if found else None
        if url is None:
            self.close()
            raise AssertionError("chromium did not start")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # drained
        # Entered as a context manager: websockets 17.1 deprecates a connection used
        # without one, and `legacy=True` is unknown before it.
        self.ws = connect(url, max_size=None, open_timeout=30).__enter__()
        self.ids = iter(range(1, 1 << 30))
        self.events: dict[str, list[dict]] = {}  # by session
        self.lock = threading.Lock()

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60) -> dict:
        with self.lock:
            n = next(self.ids)
            message = {"id": n, "method": method, "params": params or {}}
            if session:
                message["sessionId"] = session
            self.ws.send(json.dumps(message))
            deadline = time.monotonic() + timeout
            while True:
                reply = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
                if reply.get("id") == n:
                    if "error" in reply:
                        raise AssertionError(f"{method}: {reply['error']}")
                    return reply["result"]
                if "method" in reply:
                    self.events.setdefault(reply.get("sessionId", ""), []).append(reply)

    def tab(self, url: str) -> Tab:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target,
                                                      "flatten": True})["sessionId"]
        for domain in ("Network", "Runtime", "Page", "Log"):
            self.send(f"{domain}.enable", session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        return Tab(self, session, target)

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        self.proc.kill()
        self.proc.wait(10)


class Tab:
    def __init__(self, browser: Browser, session: str, target: str) -> None:
        self.browser, self.session, self.target = browser, session, target

    def eval(self, expression: str):
        result = self.browser.send("Runtime.evaluate", {
            "expression": expression, "returnByValue": True, "awaitPromise": True},
            session=self.session)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression: str, timeout: float = 30):
        deadline = time.monotonic() + timeout
        while True:  # (a page being loaded may have no document yet)
            value = self.eval(f"(() => {{ try {{ return {expression}; }} catch (e) {{ "
                              "return false; } })()")
            if value or time.monotonic() > deadline:
                assert value, f"timed out waiting for {expression}"
                return value
            time.sleep(0.05)

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.browser.events.get(self.session, [])
                if e["method"] == "Network.requestWillBeSent"]

    def console_errors(self) -> list[str]:
        return [e["params"]["entry"]["text"] for e in self.browser.events.get(self.session, [])
                if e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"]

    def ask(self, text: str, **controls: str) -> None:
        """Set the controls (element id -> value) and send `text`, as a user does."""
        script = "".join(f"document.getElementById({k.replace('_', '-')!r}).value = {v!r};"
                         for k, v in controls.items())
        self.eval(script + f"document.getElementById('prompt').value = {text!r};"
                  "document.getElementById('ask').requestSubmit(); true")

    def last_turn(self) -> dict:
        """The last assistant turn's chips by kind, and the final figures it read."""
        return self.eval("""(() => {
            const turns = document.querySelectorAll('.turn.assistant');
            const t = turns[turns.length - 1];
            const n = (k) => t.querySelectorAll('.token.' + k).length;
            return {accepted: n('accepted'), target: n('target'), draft: n('draft'),
                    done: t.dataset.done === '1', figures: window.specllamaPage.last,
                    reads: window.specllamaPage.reads, events: window.specllamaPage.events,
                    steps: document.getElementById('stat-steps').textContent,
                    tokens: document.getElementById('stat-tokens').textContent};
        })()""")

    def close(self) -> None:
        self.browser.send("Target.closeTarget", {"targetId": self.target})


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed (.ci/run installs it: apt-get install chromium)")
    b = Browser(path, tmp_path_factory.mktemp("chromium-home"))
    yield b
    b.close()


def done_turns(tab: Tab, n: int, timeout: float = 60) -> None:
    tab.wait(f"document.documentElement.dataset.turns >= {n}", timeout)


def shown_accepted(figures: dict) -> int:
    """Accepted drafts that reached the output: a round an end cut short accepted more."""
    rounds = figures["trace"]["generations"][0]["rounds"]
    return sum(min(r["accepted"], r["emitted"]) for r in rounds)


# ------------------------------------------------------------------ the page
def test_the_page_loads_with_no_request_elsewhere(server, browser):
    tab = browser.tab(server.url + "/")
    tab.wait("document.documentElement.dataset.ready === '1'")
    assert tab.eval("document.getElementById('pair').textContent") == server.model
    tab.ask("Hello")
    done_turns(tab, 1)
    urls = tab.requests()
    assert {u.split("?")[0] for u in urls} >= {server.url + "/", server.url + "/page/page.js",
                                               server.url + "/page/page.css",
                                               server.url + "/v1/models",
                                               server.url + "/v1/rounds"}
    assert all(u.startswith(server.url + "/") or u.startswith("data:") for u in urls), urls
    assert tab.console_errors() == []
    headers = httpx.get(server.url + "/", timeout=10).headers
    assert "default-src 'none'" in headers["content-security-policy"]
    tab.close()


def test_a_turn_streams_in_the_seed_colours_and_agrees_with_the_counts(server, browser):
    tab = browser.tab(server.url + "/")
    tab.wait("document.documentElement.dataset.ready === '1'")
    tab.ask("Tell me a story about a cat", temperature="0.8", draft_max="3")
    done_turns(tab, 1)
    seen = tab.last_turn()
    f = seen["figures"]
    assert seen["done"] and seen["draft"] == 0  # no draft is left blue at the end
    assert seen["reads"] > 1 and seen["events"]["figures"] >= 2  # round by round
    assert seen["events"].get("proposed", 0) > 0
    assert seen["accepted"] == shown_accepted(f)
    assert seen["accepted"] + seen["target"] == f["tokens"]
    assert seen["target"] == f["target_steps"] - sum(
        1 for r in f["trace"]["generations"][0]["rounds"] if r["emitted"] <= r["accepted"])
    assert seen["accepted"] == f["accepted"] - sum(
        max(0, r["accepted"] - r["emitted"]) for r in f["trace"]["generations"][0]["rounds"])
    assert (seen["steps"], seen["tokens"]) == (str(f["target_steps"]), str(f["tokens"]))
    assert f["trace"]["format"] == "specllama-trace/1"
    # the second turn sends the whole conversation: the prompt cache serves its prefix
    tab.ask("And then?")
    done_turns(tab, 2)
    assert tab.last_turn()["figures"]["speculative"]["prompt_tokens_reused"] > 0
    tab.close()


def test_lookup_drafts_on_a_copy_prompt_show_green(server, browser):
    tab = browser.tab(server.url + "/")
    tab.wait("document.documentElement.dataset.ready === '1'")
    tab.ask(REPEATS, temperature="0", draft_max="4", drafters="lookup")
    done_turns(tab, 1)
    # The same greedy turn again, in a new chat: the lookup copies the first answer (the
    # server's draft cache holds every output), whatever the tiny model wrote.
    tab.eval("document.getElementById('clear').click(); true")
    tab.ask(REPEATS)
    done_turns(tab, 2)
    seen = tab.last_turn()
    assert seen["figures"]["trace"]["settings"]["drafters"] == ["lookup"]
    assert {r["source"] for r in seen["figures"]["trace"]["generations"][0]["rounds"]
            if r["drafted"]} == {"lookup"}
    assert seen["accepted"] > 0 and seen["accepted"] == shown_accepted(seen["figures"])
    tab.close()


def test_drafts_from_a_prediction_show_in_their_own_colour(server, browser):
    """The prediction box sends OpenAI's `prediction`; its drafts are pink while verified
    and keep a pink mark once accepted."""
    question = "Tell me about the sea"
    answer = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": server.model, "temperature": 0,
        "messages": [{"role": "user", "content": question}]}).json()
    answer = answer["choices"][0]["message"]["content"]
    tab = browser.tab(server.url + "/")
    tab.wait("document.documentElement.dataset.ready === '1'")
    assert tab.eval("document.querySelector('.leg.draft.prediction').textContent") == \
        "Draft from your prediction"
    tab.ask(question, temperature="0", prediction=answer)
    done_turns(tab, 1)
    seen = tab.last_turn()
    assert seen["figures"]["text"] == answer
    marked = tab.eval("document.querySelectorAll('.turn.assistant .token.accepted.prediction')"
                      ".length")
    # (a round the end cut short accepted more than it showed)
    assert 0 < marked <= seen["figures"]["speculative"]["origin_accepted"]["prediction"]
    tab.close()


def test_two_tabs_stream_at_once_under_parallel_2(server, browser):
    tabs = [browser.tab(server.url + "/") for _ in range(2)]
    for tab in tabs:
        tab.wait("document.documentElement.dataset.ready === '1'")
    for tab in tabs:
        tab.ask("Write a long story about the sea", draft_max="2", max_tokens="300")
    spans = []
    for tab in tabs:
        done_turns(tab, 1)
        assert tab.last_turn()["figures"]["tokens"] > 0
        spans.append(tab.eval("(() => { const t = document.querySelector('.turn.assistant');"
                              " return [Number(t.dataset.first), Number(t.dataset.end)]; })()"))
        tab.close()
    (first_a, end_a), (first_b, end_b) = spans
    assert first_a < end_b and first_b < end_a  # each streamed while the other did
    assert server.health()["requests"]["completed"] >= 2


def test_the_page_asks_for_the_key(keyed, browser):
    tab = browser.tab(keyed.url + "/")
    tab.wait("document.documentElement.dataset.needsKey === '1'")
    assert tab.eval("document.getElementById('key-form').hidden") is False
    tab.eval(f"document.getElementById('key').value = {KEY!r};"
             "document.getElementById('key-form').requestSubmit(); true")
    tab.wait("document.documentElement.dataset.ready === '1'")
    assert tab.eval("sessionStorage.getItem('specllama-api-key')") == KEY
    assert tab.eval("localStorage.length") == 0
    tab.ask("Hello")
    done_turns(tab, 1)
    tab.close()


def test_a_link_offers_a_question_but_only_the_user_sends_it(server, browser):
    """Any site can open /?ask=...: the page fills the box and waits for the user."""
    before = server.health()["requests"]["completed"]
    tab = browser.tab(server.url + "/?ask=" + quote("Tell me a secret"))
    tab.wait("document.documentElement.dataset.ready === '1'")
    time.sleep(1.5)  # what an auto-sent turn would have needed to reach the server
    assert tab.eval("document.getElementById('prompt').value") == "Tell me a secret"
    assert not any("/v1/rounds" in u for u in tab.requests())
    assert server.health()["requests"]["completed"] == before
    tab.eval("document.getElementById('ask').requestSubmit(); true")
    done_turns(tab, 1)
    assert server.health()["requests"]["completed"] == before + 1
    tab.close()


# ------------------------------------------------------------------ the round events
def rounds(server, body: dict, headers: dict | None = None) -> list[tuple[str, dict]]:
    events = []
    with httpx.stream("POST", server.url + "/v1/rounds", json=body, timeout=60,
                      headers=headers or {}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        name = "message"
        for line in response.iter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                events.append((name, json.loads(line[5:])))
                name = "message"
    return events


def test_the_round_events_for_a_plain_http_client(server):
    events = rounds(server, {"model": server.model, "max_tokens": 30, "draft_max": 3,
                             "messages": [{"role": "user", "content": "Hello"}]})
    names = [n for n, _ in events]
    assert set(names) <= {"proposed", "accepted", "rejected", "correction", "figures"}
    last = events[-1][1]
    assert names[-1] == "figures" and last["final"] and names.count("figures") == \
        last["target_steps"] + 1
    accepted = sum(len(d["tokens"]) for n, d in events if n == "accepted")
    target = sum(1 for n, _ in events if n == "correction")
    assert accepted + target == last["tokens"]
    assert accepted == shown_accepted(last)
    # a round's events come in the seed's order: proposed, verdicts, then its figures
    order = {"proposed": 0, "accepted": 1, "rejected": 2, "correction": 3, "figures": 4}
    by_round: dict[int, list[int]] = {}
    for n, d in events[:-1]:
        by_round.setdefault(d["round"], []).append(order[n])
    assert all(v == sorted(v) and v[-1] == 4 for v in by_round.values())
    for n, d in events:
        if n == "rejected":
            assert len(d["tokens"]) == len(d["texts"]) > 0
    assert last["speculative"]["draft_max"] == 3 and "comparison" in last


def test_the_round_events_refuse_what_the_apis_refuse(server, keyed):
    body = {"model": server.model, "messages": [{"role": "user", "content": "Hi"}]}
    bad = httpx.post(server.url + "/v1/rounds", json={**body, "drafters": "telepathy"},
                     timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "drafters"
    assert httpx.post(server.url + "/v1/rounds", json={**body, "draft_max": 99},
                      timeout=10).status_code == 400
    assert httpx.post(keyed.url + "/v1/rounds", json={**body, "model": keyed.model},
                      timeout=10).status_code == 401
    assert httpx.post(server.url + "/v1/rounds", json=body, timeout=10,
                      headers={"origin": "http://example.com"}).status_code == 403
    events = rounds(keyed, {**body, "model": keyed.model, "max_tokens": 5},
                    headers={"authorization": f"Bearer {KEY}"})
    assert events[-1][1]["final"]


def test_a_turn_that_asks_for_no_drafters_gets_the_target_alone(server):
    """drafters "none" (or []) is nobody, not the server's default (chain.who_drafts)."""
    for asked in ("none", []):
        events = rounds(server, {"model": server.model, "max_tokens": 12, "draft_max": 3,
                                 "drafters": asked,
                                 "messages": [{"role": "user", "content": "Hello"}]})
        names = {n for n, _ in events}
        last = events[-1][1]
        assert not names & {"proposed", "accepted", "rejected"}, names
        assert last["trace"]["settings"]["drafters"] == [] and last["drafted"] == 0
        assert last["tokens"] > 0
