"""`specllama pull NAME|hf://OWNER/REPO/FILE`: a pair's or a file's models fetched into the
Hugging Face cache ahead of time.

huggingface_hub itself makes every request, to a fake Hub on 127.0.0.1 that answers what
it asks as the real one does: a file's HEAD and GET (``/OWNER/REPO/resolve/REV/FILE``,
with ``X-Repo-Commit``, ``ETag`` and ``Content-Length``) and a repo's file list
(``/api/models/OWNER/REPO/tree/REV``), 404 with the Hub's ``X-Error-Code`` otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from test_cli import assert_one_line_error

from specllama.models.hf import hf_cli
from specllama.models.sources import derived_path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "someone/tiny-GGUF"
DRAFT_REPO = "someone/tinier-GGUF"
TINY = b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 64  # the magic is all pull checks
DRAFT = b"GGUF\x03\x00\x00\x00" + b"draft" * 100
SPLIT = {"big-00001-of-00002.gguf": TINY + b"1", "big-00002-of-00002.gguf": TINY + b"2"}


class FakeHub:
    """The Hub's file endpoints over ``repos`` (repo -> file name -> bytes), on a thread.
    ``stall``: a file whose GET sends half its bytes, sets ``stalled`` and hangs until
    ``release`` (a download to interrupt)."""

    def __init__(self, repos: dict[str, dict[str, bytes]]) -> None:
        self.repos = repos
        self.downloads: list[str] = []  # "REPO/FILE" of each GET of a file
        self.stall: str | None = None
        self.stalled = threading.Event()
        self.release = threading.Event()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
                hub.answer(self, body=False)

            def do_GET(self) -> None:  # noqa: N802
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def answer(self, req: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = unquote(urlsplit(req.path).path)
        tree = re.match(r"^/api/models/([^/]+/[^/]+)/tree/[^/]+$", path)
        if tree and tree[1] in self.repos:
            listing = [{"type": "file", "path": name, "size": len(data),
                        "oid": hashlib.sha1(data).hexdigest()}
                       for name, data in self.repos[tree[1]].items()]
            return self.send(req, 200, json.dumps(listing).encode(), body,
                             {"Content-Type": "application/json"})
        resolve = re.match(r"^/([^/]+/[^/]+)/resolve/[^/]+/(.+)$", path)
        if not resolve or resolve[1] not in self.repos:
            return self.send(req, 404, b"", body, {"X-Error-Code": "RepoNotFound"})
        data = self.repos[resolve[1]].get(resolve[2])
        if data is None:
            return self.send(req, 404, b"", body,
                             {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT})
        headers = {"ETag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Repo-Commit": COMMIT}
        if not body:
            return self.send(req, 200, data, False, headers)
        self.downloads.append(f"{resolve[1]}/{resolve[2]}")
        if resolve[2] != self.stall:
            return self.send(req, 200, data, True, headers)
        self.send(req, 200, data[: len(data) // 2], True,
                  {**headers, "Content-Length": str(len(data))})
        self.stalled.set()
        self.release.wait(60)

    @staticmethod
    def send(req: BaseHTTPRequestHandler, status: int, data: bytes, body: bool,
             headers: dict[str, str]) -> None:
        req.send_response(status)
        for key, value in {"Content-Length": str(len(data)), **headers}.items():
            req.send_header(key, value)
        req.end_headers()
        if body:
            req.wfile.write(data)
            req.wfile.flush()


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "hub"


def _closed_port() -> int:
    """A port nothing listens on (one the system just gave out, closed again)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def env(tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This test's Hugging Face home and cache, for the CLI here and in children; its Hub
    is nowhere (the `hub` fixture puts one there)."""
    values = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(cache),
              "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"}
    for var, value in values.items():
        monkeypatch.setenv(var, value)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    _hub_constants(monkeypatch, endpoint=values["HF_ENDPOINT"], home=tmp_path / "hf")
    return values


def _hub_constants(monkeypatch: pytest.MonkeyPatch, *, endpoint: str, home: Path) -> None:
    """huggingface_hub reads its environment once, at import: keep it in step with ours.
    (Imported here, in a test, so that it never reads the environment outside one.)"""
    import huggingface_hub.constants as constants
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    for name in ("AGENT_HARNESSES_PATH", "CHECK_FOR_UPDATE_DONE_PATH", "HF_TOKEN_PATH"):
        if hasattr(constants, name):  # files it may read or write beside its cache
            monkeypatch.setattr(constants, name, str(home / name.lower()))


@pytest.fixture
def hub(env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    fake = FakeHub({REPO: {"tiny.gguf": TINY, **SPLIT}, DRAFT_REPO: {"tinier.gguf": DRAFT}})
    env["HF_ENDPOINT"] = fake.url
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    _hub_constants(monkeypatch, endpoint=fake.url, home=tmp_path / "hf")
    yield fake
    fake.close()


def snapshot(cache: Path, repo: str) -> Path:
    return cache / f"models--{repo.replace('/', '--')}" / "snapshots" / COMMIT


def write_pairs(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(body)
    return path


def test_pull_a_file_then_again_from_the_cache(run, hub, cache):
    first = run("pull", f"hf://{REPO}/tiny.gguf")
    assert first.exit_code == 0, first.output
    path = snapshot(cache, REPO) / "tiny.gguf"
    assert first.stdout == f"hf://{REPO}/tiny.gguf: downloaded: {path}\n"
    assert first.stderr == (f"downloading {REPO}/tiny.gguf from Hugging Face "
                            f"(once; cached in {cache})\n")
    assert path.read_bytes() == TINY
    assert hub.downloads == [f"{REPO}/tiny.gguf"]

    again = run("pull", f"hf://{REPO}/tiny.gguf")
    assert again.exit_code == 0, again.output
    assert again.stdout == f"hf://{REPO}/tiny.gguf: already in the cache: {path}\n"
    assert again.stderr == ""
    assert hub.downloads == [f"{REPO}/tiny.gguf"]  # not fetched twice


def test_pull_a_glob_fetches_every_part_of_a_split_gguf(run, hub, cache):
    result = run("pull", f"hf://{REPO}/big-*.gguf")
    assert result.exit_code == 0, result.output
    first = snapshot(cache, REPO) / "big-00001-of-00002.gguf"
    assert result.stdout == f"hf://{REPO}/big-*.gguf: downloaded: {first} (2 parts)\n"
    assert result.stderr == (
        f'looking for "big-*.gguf" in {REPO} on Hugging Face\n'
        f"downloading {REPO}/big-00001-of-00002.gguf from Hugging Face (once; cached in {cache})\n"
        f"downloading {REPO}/big-00002-of-00002.gguf from Hugging Face (once; cached in {cache})\n"
    )
    for name, data in SPLIT.items():
        assert (snapshot(cache, REPO) / name).read_bytes() == data


def test_pull_a_pair_fetches_target_and_draft(run, hub, cache, tmp_path):
    config = write_pairs(tmp_path, f'[pairs.mine]\ntarget = "hf://{REPO}/tiny.gguf"\n'
                                   f'draft = {{ hf = "{DRAFT_REPO}", file = "tinier.gguf" }}\n')
    result = run("pull", "mine", "--config", config)
    assert result.exit_code == 0, result.output
    target, draft = snapshot(cache, REPO) / "tiny.gguf", snapshot(cache, DRAFT_REPO) / "tinier.gguf"
    assert result.stdout == f"mine target: downloaded: {target}\nmine draft: downloaded: {draft}\n"
    assert hub.downloads == [f"{REPO}/tiny.gguf", f"{DRAFT_REPO}/tinier.gguf"]
    assert (target.read_bytes(), draft.read_bytes()) == (TINY, DRAFT)

    again = run("pull", "mine", "--config", config)
    assert again.stdout == (f"mine target: already in the cache: {target}\n"
                            f"mine draft: already in the cache: {draft}\n")
    assert again.stderr == ""


def test_a_pulled_pair_runs_offline(run, hub, cache, tmp_path, tiny_target, monkeypatch):
    hub.repos[REPO]["tiny.gguf"] = tiny_target.read_bytes()
    config = write_pairs(tmp_path, f'[pairs.mine]\ntarget = "hf://{REPO}/tiny.gguf"\n')
    assert run("pull", "mine", "--config", config).exit_code == 0
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = run("generate", "--pair", "mine", "--config", config, "--raw", "--max-tokens", 3,
                 "--threads", 1, "--n-ctx", 256, "Hello")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip()


def test_only_what_is_missing_is_downloaded(run, hub, cache, tmp_path):
    assert run("pull", f"hf://{DRAFT_REPO}/tinier.gguf").exit_code == 0
    config = write_pairs(tmp_path, f'[pairs.mine]\ntarget = "hf://{REPO}/tiny.gguf"\n'
                                   f'draft = "hf://{DRAFT_REPO}/tinier.gguf"\n')
    result = run("pull", "mine", "--config", config)
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"mine target: downloaded: {snapshot(cache, REPO) / 'tiny.gguf'}\n"
        f"mine draft: already in the cache: {snapshot(cache, DRAFT_REPO) / 'tinier.gguf'}\n")
    assert hub.downloads == [f"{DRAFT_REPO}/tinier.gguf", f"{REPO}/tiny.gguf"]


def test_models_made_here_need_no_download(run, hub, tmp_path):
    """A synthetic target and the draft derived from it are made on first use, offline; a
    lookup draft is no model at all. pull fetches nothing for them and says so."""
    config = write_pairs(tmp_path, '[pairs.synth]\ntarget = { synthetic = "tiny" }\n'
                                   'draft = { derive = "target", layers = 1 }\n'
                                   '[pairs.alone]\ntarget = { synthetic = "tiny", seed = 1 }\n')
    result = run("pull", "synth", "alone", "--config", config)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 4
    assert re.fullmatch(r"synth target: nothing to download: /\S+\.gguf \(made on first use\)",
                        lines[0]), lines[0]
    assert lines[1] == "synth draft: nothing to download: derived from the target once the " \
                       "target is here"
    assert lines[2].startswith("alone target: nothing to download: ")
    assert lines[3] == "alone draft: no model (prompt lookup)"
    assert result.stderr == "" and hub.downloads == []


def test_a_requantized_model_is_downloaded_and_made_on_first_use(run, hub, cache, tmp_path):
    config = write_pairs(tmp_path, f'[pairs.mine]\ntarget = {{ hf = "{REPO}", '
                                   'file = "tiny.gguf", quant = "F32" }\n')
    result = run("pull", "mine", "--config", config)
    assert result.exit_code == 0, result.output
    made = derived_path(snapshot(cache, REPO) / "tiny.gguf", "F32")
    assert result.stdout.splitlines() == [
        f"mine target: downloaded: {made} (made from {snapshot(cache, REPO) / 'tiny.gguf'} "
        "on first use)",
        "mine draft: no model (prompt lookup)",
    ]


def test_a_missing_local_file_is_told_before_any_download(run, hub, tmp_path):
    config = write_pairs(tmp_path, f'[pairs.mine]\ntarget = "hf://{REPO}/tiny.gguf"\n'
                                   'draft = "gone.gguf"\n')
    assert_one_line_error(run("pull", "mine", "--config", config),
                          f"draft model of pair 'mine': file not found: {tmp_path}/gone.gguf")
    assert hub.downloads == []


def test_unknown_pair_lists_the_names(run, hub, tmp_path):
    config = write_pairs(tmp_path, f'[pairs.mine]\ntarget = "hf://{REPO}/tiny.gguf"\n')
    result = run("pull", "mien", "--config", config)
    assert_one_line_error(result, f"{config}: no pair named 'mien' (did you mean 'mine'?); "
                                  "known pairs: mine, smollm2, ")


def test_offline_is_one_line_naming_the_command(run, env, cache):
    """No Hub (nothing listens at HF_ENDPOINT): one line at once, not huggingface_hub's
    retries; it names the command that fetches the file elsewhere."""
    result = run("pull", f"hf://{REPO}/tiny.gguf")
    assert_one_line_error(
        result,
        f"hf://{REPO}/tiny.gguf: {REPO}/tiny.gguf is not in the Hugging Face cache ({cache}) "
        f"and the Hugging Face Hub ({env['HF_ENDPOINT']}) could not be reached; "
        f"run: {hf_cli()} download {REPO} tiny.gguf")


def test_offline_pair_names_the_command_too(run, env, tmp_path):
    config = write_pairs(tmp_path, f'[pairs.mine]\ntarget = "hf://{REPO}/big-*.gguf"\n')
    assert_one_line_error(
        run("pull", "mine", "--config", config),
        "target model of pair 'mine': no file matching \"big-*.gguf\" from someone/tiny-GGUF",
        f"could not be reached; run: {hf_cli()} download {REPO} --include 'big-*.gguf'")
    # A run names `specllama pull` instead: one command for both models of the pair.
    assert_one_line_error(run("generate", "--pair", "mine", "--config", config, "Hi"),
                          f"could not be reached; run: specllama pull mine --config {config}")


def test_a_missing_file_or_repo_is_one_line(run, hub):
    assert_one_line_error(
        run("pull", f"hf://{REPO}/nothere.gguf"),
        f"hf://{REPO}/nothere.gguf: {REPO} has no file nothere.gguf; "
        f"see its files at {hub.url}/{REPO}/tree/main")
    assert_one_line_error(run("pull", "hf://nobody/nothing-GGUF/x.gguf"),
                          "there is no Hugging Face repository nobody/nothing-GGUF")
    glob = run("pull", f"hf://{REPO}/*q4_k_m*.gguf")
    assert (glob.exit_code, glob.stdout) == (2, "")
    assert glob.stderr == (
        f'looking for "*q4_k_m*.gguf" in {REPO} on Hugging Face\n'
        f"specllama: error: hf://{REPO}/*q4_k_m*.gguf: no file in {REPO} matches "
        '"*q4_k_m*.gguf"; its .gguf files: big-00001-of-00002.gguf, big-00002-of-00002.gguf, '
        "tiny.gguf\n")
    assert hub.downloads == []


def test_malformed_sources_are_one_line(run, env):
    assert_one_line_error(run("pull", "hf://someone"),
                          'pull: must look like "hf://OWNER/REPO/FILE.gguf"')
    assert_one_line_error(run("pull", f"https://huggingface.co/{REPO}/blob/main/tiny.gguf"),
                          f'(did you mean "hf://{REPO}/tiny.gguf"?)')


def test_offline_mode_with_the_file_cached_succeeds(run, hub, cache, monkeypatch):
    assert run("pull", f"hf://{REPO}/tiny.gguf").exit_code == 0
    hub.close()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = run("pull", f"hf://{REPO}/tiny.gguf")
    assert result.exit_code == 0, result.output
    assert result.stdout == (f"hf://{REPO}/tiny.gguf: already in the cache: "
                             f"{snapshot(cache, REPO) / 'tiny.gguf'}\n")
    missing = run("pull", f"hf://{DRAFT_REPO}/tinier.gguf")
    assert_one_line_error(missing, "and downloads are off (HF_HUB_OFFLINE=1); "
                                   f"run: {hf_cli()} download {DRAFT_REPO} tinier.gguf")


def test_the_download_draws_huggingface_hubs_progress_bar(run, hub, monkeypatch):
    # huggingface_hub draws it on a terminal; TQDM_POSITION=-1 is its switch for elsewhere.
    monkeypatch.setenv("TQDM_POSITION", "-1")
    result = run("pull", f"hf://{REPO}/tiny.gguf")
    assert result.exit_code == 0, result.output
    assert "tiny.gguf: 100%" in result.stderr


def test_ctrl_c_leaves_nothing_a_later_pull_takes_for_complete(run, hub, env, cache):
    hub.stall = "tiny.gguf"
    command = [sys.executable, "-c", "from specllama.cli import main; main()",
               "pull", f"hf://{REPO}/tiny.gguf"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **env}, text=True)
    try:
        assert hub.stalled.wait(60), "the download never started"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert out == "" and err.endswith("specllama: interrupted\n") and "Traceback" not in err
    # huggingface_hub moves a blob into the cache, and links it, only whole
    blobs = cache / f"models--{REPO.replace('/', '--')}" / "blobs"
    assert all(p.name.endswith(".incomplete") for p in blobs.glob("*"))
    assert not (snapshot(cache, REPO) / "tiny.gguf").exists()
    assert_one_line_error(run("pull", f"hf://{REPO}/tiny.gguf", env={"HF_HUB_OFFLINE": "1"}),
                          "is not in the Hugging Face cache")

    hub.stall = None
    again = subprocess.run(command, capture_output=True, env={**os.environ, **env}, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"hf://{REPO}/tiny.gguf: downloaded: ")
    assert (snapshot(cache, REPO) / "tiny.gguf").read_bytes() == TINY
