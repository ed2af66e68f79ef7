"""Hugging Face model sources (``hf://OWNER/REPO/FILE.gguf``): config forms, resolution
from a fake Hugging Face cache laid out like the real one, downloads through a fake
``huggingface_hub``, and ``source_status``.

No test touches the network: sockets are refused, ``HF_HUB_OFFLINE=1`` is set (tests of
the download path unset it and install a fake ``huggingface_hub`` module instead), and the
real huggingface_hub is only used with ``local_files_only=True`` against the fake cache.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
import socket
import sys
import textwrap
import types
from pathlib import Path

import pytest

import specllama
from specllama.errors import ConfigError, ModelLoadError
from specllama.models import hferrors
from specllama.models.config import ModelSource, Pair, load_config, packaged_config_path
from specllama.models.sources import (
    hf_cache_dir,
    hf_cli,
    hf_offline,
    resolve_pair,
    resolve_source,
)
from specllama.models.status import pending_downloads, source_status

GGUF_BYTES = b"GGUF" + b"\x03\x00\x00\x00" + bytes(range(64))
COMMIT = "0123456789abcdef0123456789abcdef01234567"
NEW_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
QWEN = "Qwen/Qwen2.5-7B-Instruct-GGUF"
QWEN_DRAFT = "Qwen/Qwen2.5-0.5B-Instruct-GGUF"
SHARD1 = "qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf"
SHARD2 = "qwen2.5-7b-instruct-q4_k_m-00002-of-00002.gguf"
DRAFT_FILE = "qwen2.5-0.5b-instruct-q8_0.gguf"
HAS_HUB = importlib.util.find_spec("huggingface_hub") is not None


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache at ~/.cache/huggingface/hub of a fake $HOME; offline."""
    home = tmp_path / "home"
    hf_home = home / ".cache" / "huggingface"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPECLLAMA_CACHE_DIR", str(tmp_path / "specllama-cache"))
    # huggingface_hub reads its environment once, at import: keep its constants in step
    # too, in case it was imported before this test (our code reads the env itself).
    if HAS_HUB:
        import huggingface_hub.constants as constants

        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(constants, "HF_HOME", str(hf_home))
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    return hf_home / "hub"


def add_to_cache(
    cache: Path,
    repo: str,
    files: dict[str, bytes | Path],
    *,
    revision: str = "main",
    commit: str = COMMIT,
) -> Path:
    """Put ``files`` into ``cache`` as huggingface_hub does: content-addressed blobs,
    ``refs/<revision>`` holding the commit, and relative symlinks under
    ``snapshots/<commit>/``. Returns the snapshot directory."""
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    ref = repo_dir / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)  # (huggingface_hub writes it without a newline)
    snapshot = repo_dir / "snapshots" / commit
    for name, content in files.items():
        data = content.read_bytes() if isinstance(content, Path) else content
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    snapshot.mkdir(parents=True, exist_ok=True)
    return snapshot


def pair_from_toml(tmp_path: Path, body: str, name: str = "p") -> Pair:
    config = tmp_path / "models.toml"
    config.write_text(f"[pairs.{name}]\n" + textwrap.dedent(body))
    return load_config(config).pair(name)


def hf_pair(tmp_path: Path, target: str, draft: str = "lookup", name: str = "p") -> Pair:
    draft_toml = draft if draft.startswith("{") else f'"{draft}"'
    return pair_from_toml(tmp_path, f'target = "{target}"\ndraft = {draft_toml}\n', name)


def load_error(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def target_error(pair) -> str:
    """The one-line message resolving the pair's target fails with, as `specllama pull`
    gets it: advising `hf download ...` (a run advises `specllama pull NAME` instead; see
    test_a_run_offline_advises_specllama_pull)."""
    with pytest.raises(ModelLoadError) as info:
        resolve_source(pair.target, pair=pair, advise_pull=False)
    return load_error(info)


CLI = hf_cli()


# --------------------------------------------------------------------------- config forms


def test_hf_string_forms(tmp_path):
    pair = pair_from_toml(
        tmp_path,
        f"""\
        target = "hf://{QWEN}/qwen2.5-7b-instruct-q4_k_m*.gguf"
        draft = "hf://{QWEN_DRAFT}/{DRAFT_FILE}"
        """,
    )
    assert pair.target == ModelSource(
        kind="hf", repo=QWEN, file="qwen2.5-7b-instruct-q4_k_m*.gguf", revision="main"
    )
    assert pair.target.is_glob and not pair.draft.is_glob
    assert pair.draft == ModelSource.from_hf(QWEN_DRAFT, DRAFT_FILE)
    assert pair.draft.revision == "main"
    assert pair.draft.describe() == f"hf://{QWEN_DRAFT}/{DRAFT_FILE}"
    assert pair.draft.hf_url == f"hf://{QWEN_DRAFT}/{DRAFT_FILE}"


def test_hf_table_forms(tmp_path):
    pair = pair_from_toml(
        tmp_path,
        f"""\
        target = {{ hf = "{QWEN}", file = "sub/dir/model-Q4_K_M.gguf", revision = "v1.0" }}
        draft = {{ hf = "{QWEN_DRAFT}", file = "{DRAFT_FILE}" }}
        """,
    )
    assert pair.target == ModelSource.from_hf(QWEN, "sub/dir/model-Q4_K_M.gguf", "v1.0")
    assert pair.target.describe() == f"hf://{QWEN}/sub/dir/model-Q4_K_M.gguf (revision v1.0)"
    # the table without revision is the same source as the string form
    assert pair.draft == ModelSource.from_hf_url(f"hf://{QWEN_DRAFT}/{DRAFT_FILE}")


def test_hf_file_may_be_in_a_subfolder(tmp_path):
    pair = hf_pair(tmp_path, "hf://unsloth/Qwen3-GGUF/Q4_K_M/Qwen3-Q4_K_M-00001-of-00002.gguf")
    assert pair.target.repo == "unsloth/Qwen3-GGUF"
    assert pair.target.file == "Q4_K_M/Qwen3-Q4_K_M-00001-of-00002.gguf"


FORM = 'must look like "hf://OWNER/REPO/FILE.gguf" (or a glob: "hf://OWNER/REPO/*q4_k_m*.gguf")'
REPO_RULE = "must be \"OWNER/REPO\" (letters, digits, '-', '_' and '.')"
FILE_RULE = 'must end in .gguf (a file name, or a glob like "*q4_k_m*.gguf")'

HF_ERRORS = [
    ('target = "hf://Qwen/Qwen2.5-7B-Instruct-GGUF"', f'target: {FORM}, got "hf://{QWEN}"'),
    ('target = "hf://Qwen/Qwen2.5-7B-Instruct-GGUF/"', f'target: {FORM}, got "hf://{QWEN}/"'),
    ('target = "hf://Qwen//x.gguf"', f'target: {FORM}, got "hf://Qwen//x.gguf"'),
    ('target = "hf://"', f'target: {FORM}, got "hf://"'),
    (
        'target = "hf://Qw en/Repo/x.gguf"',
        f'target: Hugging Face repository {REPO_RULE}, got "Qw en/Repo"',
    ),
    (
        'target = "hf://Qwen/Repo@v2/x.gguf"',
        f'target: Hugging Face repository {REPO_RULE}, got "Qwen/Repo@v2" (a revision goes in '
        'the table form: { hf = "OWNER/REPO", file = "...", revision = "..." })',
    ),
    (
        'target = "hf://Qwen/Re--po/x.gguf"',
        "target: Hugging Face repository must not contain '--' or '..', got \"Qwen/Re--po\"",
    ),
    (
        'target = "hf://Qwen/Repo/README.md"',
        f'target: Hugging Face file {FILE_RULE}, got "README.md"',
    ),
    (
        'target = "hf://Qwen/Repo/*Q4_K_M*"',
        f'target: Hugging Face file {FILE_RULE}, got "*Q4_K_M*"',
    ),
    (
        'target = "hf://Qwen/Repo/../x.gguf"',
        "target: Hugging Face file must be a file name (or glob) inside the repository, "
        'got "../x.gguf"',
    ),
    (
        'target = "hf:Qwen/Repo/x.gguf"',
        'target: a Hugging Face source is written "hf://OWNER/REPO/FILE.gguf", '
        'got "hf:Qwen/Repo/x.gguf"',
    ),
    (
        'target = "HF://Qwen/Repo/x.gguf"',
        'target: a Hugging Face source is written "hf://OWNER/REPO/FILE.gguf", '
        'got "HF://Qwen/Repo/x.gguf"',
    ),
    (
        'target = "https://huggingface.co/Qwen/Repo/blob/main/x-q4_k_m.gguf"',
        'target: must be a local path or "hf://OWNER/REPO/FILE.gguf", got the URL '
        '"https://huggingface.co/Qwen/Repo/blob/main/x-q4_k_m.gguf" '
        '(did you mean "hf://Qwen/Repo/x-q4_k_m.gguf"?)',
    ),
    (
        'target = "https://huggingface.co/Qwen/Repo/resolve/v2/x.gguf?download=true"',
        'target: must be a local path or "hf://OWNER/REPO/FILE.gguf", got the URL '
        '"https://huggingface.co/Qwen/Repo/resolve/v2/x.gguf?download=true" '
        '(did you mean { hf = "Qwen/Repo", file = "x.gguf", revision = "v2" }?)',
    ),
    (
        'target = "https://example.com/x.gguf"',
        'target: must be a local path or "hf://OWNER/REPO/FILE.gguf", got the URL '
        '"https://example.com/x.gguf"',
    ),
    # the table form
    ('target = { hf = "Qwen/Repo" }', "target.file: required but missing"),
    (
        'target = { file = "x.gguf", hf = 3 }',
        'target.hf: must be a "OWNER/REPO" string, got integer 3',
    ),
    (
        'target = { hf = "hf://Qwen/Repo", file = "x.gguf" }',
        'target.hf: must be "OWNER/REPO" without hf://, got "hf://Qwen/Repo"',
    ),
    (
        'target = { hf = "Qwen/Repo/x.gguf", file = "x.gguf" }',
        f'target.hf: {REPO_RULE}, got "Qwen/Repo/x.gguf" '
        '(did you mean hf = "Qwen/Repo", file = "x.gguf"?)',
    ),
    ('target = { hf = "Qwen", file = "x.gguf" }', f'target.hf: {REPO_RULE}, got "Qwen"'),
    ('target = { hf = "Qwen/Repo", file = 1 }', "target.file: must be a string, got integer 1"),
    ('target = { hf = "Qwen/Repo", file = "x.bin" }', f'target.file: {FILE_RULE}, got "x.bin"'),
    (
        'target = { hf = "Qwen/Repo", file = "/x.gguf" }',
        'target.file: must be a file name (or glob) inside the repository, got "/x.gguf"',
    ),
    (
        'target = { hf = "Qwen/Repo", file = "x.gguf", revision = 2 }',
        "target.revision: must be a branch, tag or commit (a string), got integer 2",
    ),
    (
        'target = { hf = "Qwen/Repo", file = "x.gguf", revision = "" }',
        'target.revision: must be a branch, tag or commit, got ""',
    ),
    (
        'target = { hf = "Qwen/Repo", file = "x.gguf", revision = "a b" }',
        'target.revision: must be a branch, tag or commit, got "a b"',
    ),
    (
        'target = { hf = "Qwen/Repo", file = "x.gguf", quantization = "Q4_0" }',
        "target.quantization: unknown key for an hf source (expected: hf, file, revision)",
    ),
]


@pytest.mark.parametrize(("line", "expected"), HF_ERRORS, ids=[c[0] for c in HF_ERRORS])
def test_hf_config_errors(tmp_path, line, expected):
    path = tmp_path / "models.toml"
    path.write_text(f'[pairs.p]\n{line}\ndraft = "lookup"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert message == f"{path}: pairs.p.{expected}"


def test_hf_is_allowed_for_the_draft_too(tmp_path):
    pair = hf_pair(tmp_path, "t.gguf", f"hf://{QWEN_DRAFT}/{DRAFT_FILE}")
    assert pair.draft.kind == "hf"


def test_model_source_validates_hf_fields():
    with pytest.raises(ValueError):
        ModelSource(kind="hf", repo="Qwen/Repo")  # no file
    with pytest.raises(ValueError):
        ModelSource(kind="hf", repo="Qwen", file="x.gguf")
    with pytest.raises(ValueError):
        ModelSource(kind="hf", repo="Qwen/Repo", file="x.bin")
    with pytest.raises(ValueError):
        ModelSource(kind="hf", repo="Qwen/Repo", file="x.gguf", quant="Q4_0")
    with pytest.raises(ValueError):
        ModelSource.from_hf_url("hf://Qwen/Repo")
    with pytest.raises(ValueError):
        ModelSource.from_hf_url("https://huggingface.co/Qwen/Repo/x.gguf")
    with pytest.raises(ValueError):
        ModelSource.lookup().hf_url  # noqa: B018
    assert ModelSource(kind="hf", repo="Qwen/Repo", file="x.gguf").revision == "main"


def test_the_shipped_config_lists_hf_pairs_needing_a_download():
    cfg = load_config(packaged_config_path())
    assert cfg.default == "smollm2"
    assert cfg.names[:2] == ["smollm2", "smollm2-iq4nl"]  # unchanged, first
    hf_pairs = [p for p in cfg.pairs.values() if p.target.kind == "hf"]
    assert {p.name for p in hf_pairs} >= {"qwen7b", "llama8b", "qwen-coder7b", "qwen3.5-9b",
                                          "qwen3.5-9b-0.8b", "lfm2", "gemma3-4b"}
    for pair in hf_pairs:
        # a draft from the hub, or none: the target drafts for itself (lookup, MTP)
        assert pair.draft.kind in ("hf", "lookup")
        assert "needs a download" in pair.description and "GB" in pair.description
    assert cfg.pair("qwen3.5-9b").draft.kind == "lookup"
    qwen = cfg.pair("qwen7b")
    assert qwen.target == ModelSource.from_hf(QWEN, "qwen2.5-7b-instruct-q4_k_m*.gguf")
    assert qwen.draft == ModelSource.from_hf(QWEN_DRAFT, DRAFT_FILE)
    assert cfg.pair("llama8b").target.repo == "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF"
    assert cfg.pair("llama8b").draft.repo == "bartowski/Llama-3.2-1B-Instruct-GGUF"


# --------------------------------------------------------------------------- the cache dir


def test_hf_cache_dir_follows_the_environment_at_call_time(tmp_path, monkeypatch, hf_cache):
    assert hf_cache_dir() == hf_cache
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hf_cache_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))
    assert hf_cache_dir() == tmp_path / "legacy"
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert hf_cache_dir() == tmp_path / "hfhome" / "hub"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert hf_cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hub"


@pytest.mark.parametrize(
    ("value", "offline"),
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("on", True),
        ("0", False),
        ("", False),
        ("false", False),
    ],
)
def test_hf_offline(monkeypatch, value, offline):
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert hf_offline() == (f"HF_HUB_OFFLINE={value}" if offline else None)


def test_transformers_offline_counts_too(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    assert hf_offline() == "TRANSFORMERS_OFFLINE=1"


@pytest.mark.parametrize(
    ("version", "cli"),
    [
        ("0.20.3", "huggingface-cli"),
        ("0.33.9", "huggingface-cli"),
        ("0.34.0", "hf"),
        ("1.0.0", "hf"),
        (None, "hf"),
    ],
)
def test_hf_cli_name_follows_the_installed_version(monkeypatch, version, cli):
    monkeypatch.setattr(
        hferrors,
        "_hub_version",
        lambda: None if version is None else tuple(int(x) for x in version.split(".")[:2]),
    )
    assert hf_cli() == cli


# --------------------------------------------------------------------------- from the cache


def test_exact_file_found_in_the_cache(tmp_path, hf_cache, monkeypatch):
    snapshot = add_to_cache(hf_cache, QWEN_DRAFT, {DRAFT_FILE: GGUF_BYTES})
    pair = hf_pair(tmp_path, f"hf://{QWEN_DRAFT}/{DRAFT_FILE}")
    # A cached model needs neither the network nor even huggingface_hub.
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    path = resolve_source(pair.target, pair=pair)
    assert path == snapshot / DRAFT_FILE
    assert path.is_symlink()  # the snapshot name, not the blob: split parts stay siblings
    assert path.read_bytes() == GGUF_BYTES
    assert resolve_pair(pair) == (path, None)


def test_glob_found_in_the_cache(tmp_path, hf_cache):
    snapshot = add_to_cache(
        hf_cache,
        "bartowski/Llama-3.2-1B-Instruct-GGUF",
        {
            "Llama-3.2-1B-Instruct-Q4_K_S.gguf": GGUF_BYTES + b"s",
            "Llama-3.2-1B-Instruct-Q4_K_M.gguf": GGUF_BYTES + b"m",
            "Llama-3.2-1B-Instruct-Q8_0.gguf": GGUF_BYTES + b"8",
            "README.md": b"# readme",
        },
    )
    pair = hf_pair(tmp_path, "hf://bartowski/Llama-3.2-1B-Instruct-GGUF/*Q4_K*.gguf")
    # two matches: the first in sorted order, every time
    assert resolve_source(pair.target, pair=pair) == snapshot / "Llama-3.2-1B-Instruct-Q4_K_M.gguf"
    # the match is case-sensitive, like `hf download --include`
    lower = hf_pair(tmp_path, "hf://bartowski/Llama-3.2-1B-Instruct-GGUF/*q8_0.gguf")
    with pytest.raises(ModelLoadError, match="no file matching"):
        resolve_source(lower.target, pair=lower)


def test_glob_of_split_gguf_resolves_to_the_first_part(tmp_path, hf_cache):
    snapshot = add_to_cache(
        hf_cache,
        QWEN,
        {
            SHARD2: GGUF_BYTES + b"2",
            SHARD1: GGUF_BYTES + b"1",
            "qwen2.5-7b-instruct-q8_0-00001-of-00003.gguf": GGUF_BYTES,
        },
    )
    pair = hf_pair(tmp_path, f"hf://{QWEN}/qwen2.5-7b-instruct-q4_k_m*.gguf")
    assert resolve_source(pair.target, pair=pair) == snapshot / SHARD1
    # naming a later part resolves to the first one (llama.cpp loads the split from it)
    later = hf_pair(tmp_path, f"hf://{QWEN}/{SHARD2}")
    assert resolve_source(later.target, pair=later) == snapshot / SHARD1
    assert pending_downloads(pair) == []


def test_split_gguf_with_a_part_missing_says_which(tmp_path, hf_cache):
    add_to_cache(hf_cache, QWEN, {SHARD1: GGUF_BYTES})
    pair = hf_pair(tmp_path, f"hf://{QWEN}/qwen2.5-7b-instruct-q4_k_m*.gguf", name="qwen7b")
    message = target_error(pair)
    assert message == (
        f"target model of pair 'qwen7b': {QWEN}/{SHARD2} is not in the Hugging Face cache "
        f"(~/.cache/huggingface/hub) and downloads are off (HF_HUB_OFFLINE=1); "
        f"run: {CLI} download {QWEN} {SHARD2}"
    )


def test_missing_file_gives_the_exact_command(tmp_path):
    pair = hf_pair(
        tmp_path,
        f"hf://{QWEN}/qwen2.5-7b-instruct-q4_k_m.gguf",
        f"hf://{QWEN_DRAFT}/{DRAFT_FILE}",
        name="qwen7b",
    )
    assert target_error(pair) == (
        "target model of pair 'qwen7b': Qwen/Qwen2.5-7B-Instruct-GGUF/"
        "qwen2.5-7b-instruct-q4_k_m.gguf is not in the Hugging Face cache "
        "(~/.cache/huggingface/hub) and downloads are off (HF_HUB_OFFLINE=1); "
        f"run: {CLI} download Qwen/Qwen2.5-7B-Instruct-GGUF qwen2.5-7b-instruct-q4_k_m.gguf"
    )


def test_a_run_offline_advises_specllama_pull(tmp_path, monkeypatch):
    """A run names the one command that fetches both models of its pair, with --config
    where a plain `specllama pull` would read another models.toml."""
    pair = hf_pair(tmp_path, f"hf://{QWEN}/{SHARD1}", f"hf://{QWEN_DRAFT}/{DRAFT_FILE}",
                   name="qwen7b")
    with pytest.raises(ModelLoadError) as info:
        resolve_pair(pair)
    assert load_error(info) == (
        f"target model of pair 'qwen7b': 2 files of {QWEN} ({SHARD1}, {SHARD2}) are not in "
        "the Hugging Face cache (~/.cache/huggingface/hub) and downloads are off "
        f"(HF_HUB_OFFLINE=1); run: specllama pull qwen7b --config {tmp_path}/models.toml"
    )
    monkeypatch.chdir(tmp_path)  # ./models.toml is the one found
    with pytest.raises(ModelLoadError, match=r"; run: specllama pull qwen7b$"):
        resolve_pair(pair)
    builtin = load_config(packaged_config_path()).pair("llama8b")
    with pytest.raises(ModelLoadError, match=r"; run: specllama pull llama8b$"):
        resolve_pair(builtin)
    in_code = Pair("mine", ModelSource.from_hf(QWEN_DRAFT, DRAFT_FILE), ModelSource.lookup())
    with pytest.raises(ModelLoadError, match=f"; run: {CLI} download {QWEN_DRAFT} {DRAFT_FILE}$"):
        resolve_pair(in_code)


def test_missing_split_gguf_names_all_parts(tmp_path):
    pair = hf_pair(tmp_path, f"hf://{QWEN}/{SHARD1}")
    message = target_error(pair)
    assert message == (
        f"target model of pair 'p': 2 files of {QWEN} ({SHARD1}, {SHARD2}) are not in the "
        "Hugging Face cache (~/.cache/huggingface/hub) and downloads are off "
        f"(HF_HUB_OFFLINE=1); run: {CLI} download {QWEN} {SHARD1} {SHARD2}"
    )


def test_glob_with_no_cached_match(tmp_path, hf_cache):
    add_to_cache(hf_cache, QWEN, {"qwen2.5-7b-instruct-q8_0.gguf": GGUF_BYTES})
    pair = hf_pair(tmp_path, f"hf://{QWEN}/*q4_k_m*.gguf")
    message = target_error(pair)
    assert message == (
        f"target model of pair 'p': no file matching \"*q4_k_m*.gguf\" from {QWEN} is in the "
        "Hugging Face cache (~/.cache/huggingface/hub) and downloads are off "
        f"(HF_HUB_OFFLINE=1); run: {CLI} download {QWEN} --include '*q4_k_m*.gguf' "
        f"(list the repo's files at https://huggingface.co/{QWEN}/tree/main)"
    )


def test_a_cache_outside_home_is_shown_in_full(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    pair = hf_pair(tmp_path, "hf://Qwen/Repo/x.gguf")
    with pytest.raises(ModelLoadError, match=f"cache \\({tmp_path}/hub\\)"):
        resolve_source(pair.target, pair=pair)


def test_revision_from_refs_or_a_commit_hash(tmp_path, hf_cache):
    add_to_cache(hf_cache, QWEN_DRAFT, {DRAFT_FILE: GGUF_BYTES + b"main"})
    tagged = add_to_cache(
        hf_cache, QWEN_DRAFT, {DRAFT_FILE: GGUF_BYTES + b"v1"}, revision="v1", commit=NEW_COMMIT
    )

    def pair_at(revision: str) -> Pair:
        return pair_from_toml(
            tmp_path,
            f'target = {{ hf = "{QWEN_DRAFT}", file = "{DRAFT_FILE}", revision = "{revision}" }}\n'
            'draft = "lookup"\n',
        )

    for revision in ("v1", NEW_COMMIT):
        pair = pair_at(revision)
        path = resolve_source(pair.target, pair=pair)
        assert path == tagged / DRAFT_FILE and path.read_bytes().endswith(b"v1")
    # a revision that is not cached
    pair = pair_at("v2")
    message = target_error(pair)
    assert message.endswith(f"run: {CLI} download {QWEN_DRAFT} {DRAFT_FILE} --revision v2")


def test_a_dangling_snapshot_link_is_not_cached(tmp_path, hf_cache):
    snapshot = add_to_cache(hf_cache, QWEN_DRAFT, {DRAFT_FILE: GGUF_BYTES})
    os.unlink((snapshot / DRAFT_FILE).resolve())  # blob gone (a cleaned-up cache)
    pair = hf_pair(tmp_path, f"hf://{QWEN_DRAFT}/{DRAFT_FILE}")
    with pytest.raises(ModelLoadError, match="is not in the Hugging Face cache"):
        resolve_source(pair.target, pair=pair)
    assert source_status(pair).startswith("needs download (target")


def test_a_cached_file_that_is_not_gguf(tmp_path, hf_cache):
    snapshot = add_to_cache(hf_cache, QWEN_DRAFT, {DRAFT_FILE: b"<html>rate limited</html>"})
    pair = hf_pair(tmp_path, f"hf://{QWEN_DRAFT}/{DRAFT_FILE}")
    message = target_error(pair)
    assert message == (
        f"target model of pair 'p': {snapshot / DRAFT_FILE} is not a GGUF file (it starts "
        "with b'<htm', not b'GGUF'); llama.cpp needs .gguf models "
        f"(set by pairs.p.target in {tmp_path}/models.toml)"
    )


def test_without_huggingface_hub_an_uncached_model_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    pair = hf_pair(tmp_path, f"hf://{QWEN_DRAFT}/{DRAFT_FILE}")
    message = target_error(pair)
    assert message == (
        f"target model of pair 'p': {QWEN_DRAFT}/{DRAFT_FILE} is not in the Hugging Face "
        "cache (~/.cache/huggingface/hub) and downloading it needs the huggingface_hub "
        "package; install it with: pip install 'huggingface-hub>=0.20'"
    )


def test_the_fake_cache_is_what_huggingface_hub_reads(tmp_path, hf_cache):
    """Our cache reader and huggingface_hub agree on the layout (offline, local only)."""
    import huggingface_hub

    snapshot = add_to_cache(hf_cache, QWEN, {SHARD1: GGUF_BYTES, SHARD2: GGUF_BYTES})
    for name in (SHARD1, SHARD2):
        assert huggingface_hub.try_to_load_from_cache(QWEN, name, cache_dir=hf_cache) == str(
            snapshot / name
        )
        got = huggingface_hub.hf_hub_download(
            QWEN, name, cache_dir=str(hf_cache), local_files_only=True
        )
        assert Path(got) == snapshot / name
    pair = hf_pair(tmp_path, f"hf://{QWEN}/*q4_k_m*.gguf")
    assert resolve_source(pair.target, pair=pair) == snapshot / SHARD1


def test_real_hub_error_classes_are_recognized():
    from huggingface_hub import errors as hub_errors  # 0.24+; utils re-exports them

    def names(cls):
        return {c.__name__ for c in cls.__mro__}

    assert "RepositoryNotFoundError" in names(hub_errors.GatedRepoError)
    assert "EntryNotFoundError" in names(hub_errors.RemoteEntryNotFoundError)
    assert hferrors._UNREACHABLE & names(hub_errors.LocalEntryNotFoundError)
    assert "ConnectionError" in names(hub_errors.OfflineModeIsEnabled)


# --------------------------------------------------------------------------- downloading


class _HubError(OSError):
    pass


class HfHubHTTPError(_HubError):
    pass


class RepositoryNotFoundError(HfHubHTTPError):
    pass


class GatedRepoError(RepositoryNotFoundError):
    pass


class RevisionNotFoundError(HfHubHTTPError):
    pass


class EntryNotFoundError(Exception):
    pass


class RemoteEntryNotFoundError(HfHubHTTPError, EntryNotFoundError):
    pass


class LocalEntryNotFoundError(FileNotFoundError, EntryNotFoundError):
    pass


class OfflineModeIsEnabled(ConnectionError):
    pass


class FakeHub(types.ModuleType):
    """Stands in for huggingface_hub: 'downloads' from an in-memory repo into the cache
    layout, and records every call."""

    def __init__(self, remote: dict[str, dict[str, bytes]]) -> None:
        super().__init__("huggingface_hub")
        self.remote = remote
        self.calls: list[tuple] = []
        self.heads: list[tuple] = []
        self.error: BaseException | None = None

    def hf_hub_download(self, repo_id, filename, *, revision=None, cache_dir=None, **kwargs):
        self.calls.append(("download", repo_id, filename, revision, cache_dir))
        if self.error is not None:
            raise self.error
        files = self.remote.get(repo_id)
        if files is None:
            raise RepositoryNotFoundError(f"404 {repo_id}")
        if filename not in files:
            raise RemoteEntryNotFoundError(f"404 {repo_id}/{filename}")
        snapshot = add_to_cache(
            Path(cache_dir), repo_id, {filename: files[filename]}, revision=revision or "main"
        )
        return str(snapshot / filename)

    def hf_hub_url(self, repo_id, filename, *, revision=None, **kwargs):
        return (repo_id, filename, revision)  # what get_hf_file_metadata is then asked

    def get_hf_file_metadata(self, url, **kwargs):
        """The HEAD request that tells an unreachable Hub before hf_hub_download would
        retry it (recorded apart: `calls` are the downloads and listings)."""
        repo_id, filename, revision = url
        self.heads.append(url)
        if self.error is not None:
            raise self.error
        if repo_id not in self.remote:
            raise RepositoryNotFoundError(f"404 {repo_id}")
        if filename not in self.remote[repo_id]:
            raise RemoteEntryNotFoundError(f"404 {repo_id}/{filename}")

    def HfApi(self):  # noqa: N802 - the real name
        hub = self

        class Api:
            def list_repo_files(self, repo_id, *, revision=None, **kwargs):
                hub.calls.append(("list", repo_id, revision))
                if hub.error is not None:
                    raise hub.error
                if repo_id not in hub.remote:
                    raise RepositoryNotFoundError(f"404 {repo_id}")
                return list(hub.remote[repo_id])

        return Api()


@pytest.fixture
def online(monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE")


@pytest.fixture
def hub(monkeypatch, online) -> FakeHub:
    fake = FakeHub(
        {
            QWEN: {
                SHARD1: GGUF_BYTES + b"1",
                SHARD2: GGUF_BYTES + b"2",
                "qwen2.5-7b-instruct-q8_0.gguf": GGUF_BYTES,
                "README.md": b"# readme",
            },
            QWEN_DRAFT: {DRAFT_FILE: GGUF_BYTES + b"draft"},
        }
    )
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    return fake


def test_download_exact_file_then_reuse_the_cache(tmp_path, hf_cache, hub):
    pair = hf_pair(tmp_path, f"hf://{QWEN_DRAFT}/{DRAFT_FILE}")
    messages: list[str] = []
    path = resolve_source(pair.target, pair=pair, progress=messages.append)
    assert (
        path
        == hf_cache / f"models--{QWEN_DRAFT.replace('/', '--')}" / "snapshots" / COMMIT / DRAFT_FILE
    )
    assert path.read_bytes() == GGUF_BYTES + b"draft"
    # the cache dir is passed explicitly: huggingface_hub's import-time constants don't matter
    assert hub.calls == [("download", QWEN_DRAFT, DRAFT_FILE, "main", str(hf_cache))]
    assert messages == [
        f"downloading {QWEN_DRAFT}/{DRAFT_FILE} from Hugging Face "
        "(once; cached in ~/.cache/huggingface/hub)"
    ]
    # second time: straight from the cache, no call at all
    assert resolve_source(pair.target, pair=pair) == path
    assert len(hub.calls) == 1
    assert source_status(pair) == "ready (in HF cache)"


def test_download_glob_fetches_every_part_of_a_split_gguf(tmp_path, hf_cache, hub):
    pair = hf_pair(tmp_path, f"hf://{QWEN}/qwen2.5-7b-instruct-q4_k_m*.gguf")
    messages: list[str] = []
    path = resolve_source(pair.target, pair=pair, progress=messages.append)
    assert path.name == SHARD1
    assert (path.parent / SHARD2).read_bytes() == GGUF_BYTES + b"2"
    assert [c[:3] for c in hub.calls] == [
        ("list", QWEN, "main"),
        ("download", QWEN, SHARD1),
        ("download", QWEN, SHARD2),
    ]
    assert messages[0] == (
        f'looking for "qwen2.5-7b-instruct-q4_k_m*.gguf" in {QWEN} on Hugging Face'
    )
    assert len(messages) == 3


def test_a_missing_part_is_downloaded_beside_the_cached_one(tmp_path, hf_cache, hub):
    snapshot = add_to_cache(hf_cache, QWEN, {SHARD1: GGUF_BYTES + b"1"})
    pair = hf_pair(tmp_path, f"hf://{QWEN}/*q4_k_m*.gguf")
    messages: list[str] = []
    assert resolve_source(pair.target, pair=pair, progress=messages.append) == snapshot / SHARD1
    # no listing (the cache had a match); every part through hf_hub_download, one announced
    assert [c[:3] for c in hub.calls] == [("download", QWEN, SHARD1), ("download", QWEN, SHARD2)]
    assert messages == [
        f"downloading {QWEN}/{SHARD2} from Hugging Face (once; cached in ~/.cache/huggingface/hub)"
    ]


def test_download_glob_with_no_match_in_the_repo(tmp_path, hub):
    pair = hf_pair(tmp_path, f"hf://{QWEN}/*IQ2_XS*.gguf")
    message = target_error(pair)
    assert message == (
        f"target model of pair 'p': no file in {QWEN} matches \"*IQ2_XS*.gguf\"; its .gguf "
        f"files: {SHARD1}, {SHARD2}, qwen2.5-7b-instruct-q8_0.gguf "
        f"(set by pairs.p.target in {tmp_path}/models.toml)"
    )


def hub_failure(tmp_path, hub, error, target=f"hf://{QWEN_DRAFT}/{DRAFT_FILE}") -> str:
    hub.error = error
    pair = hf_pair(tmp_path, target)
    return target_error(pair)


def test_no_network_is_offline(tmp_path, hub):
    error = LocalEntryNotFoundError("An error happened while trying to locate the file")
    assert hub_failure(tmp_path, hub, error) == (
        f"target model of pair 'p': {QWEN_DRAFT}/{DRAFT_FILE} is not in the Hugging Face "
        "cache (~/.cache/huggingface/hub) and the Hugging Face Hub (https://huggingface.co) "
        f"could not be reached; run: {CLI} download {QWEN_DRAFT} {DRAFT_FILE}"
    )


def test_a_raw_connection_error_is_offline_too(tmp_path, hub):
    message = hub_failure(tmp_path, hub, ConnectionError("Name or service not known"))
    assert "could not be reached; run:" in message


def test_offline_mode_fixed_at_import_time(tmp_path, hub):
    # huggingface_hub imported while HF_HUB_OFFLINE was set: it refuses, wrapped.
    try:
        raise OfflineModeIsEnabled("offline mode is enabled")
    except OfflineModeIsEnabled as cause:
        error = LocalEntryNotFoundError("cannot find the requested files")
        error.__cause__ = cause
    message = hub_failure(tmp_path, hub, error)
    assert "downloads are off (huggingface_hub was imported with HF_HUB_OFFLINE set)" in message
    assert message.endswith(f"run: {CLI} download {QWEN_DRAFT} {DRAFT_FILE}")


def test_unknown_repo(tmp_path, hub):
    pair = hf_pair(tmp_path, "hf://nobody/nothing-GGUF/x.gguf")
    message = target_error(pair)
    login = "hf auth login" if CLI == "hf" else "huggingface-cli login"
    assert message == (
        "target model of pair 'p': there is no Hugging Face repository nobody/nothing-GGUF "
        f"(or it is private: log in with `{login}`) "
        f"(set by pairs.p.target in {tmp_path}/models.toml)"
    )


def test_gated_repo(tmp_path, hub):
    message = hub_failure(tmp_path, hub, GatedRepoError("403 gated"))
    assert message.startswith(
        f"target model of pair 'p': {QWEN_DRAFT} is a gated repository: accept its terms at "
        f"https://huggingface.co/{QWEN_DRAFT} and log in with `"
    )


def test_unknown_file_in_the_repo(tmp_path, hub):
    pair = hf_pair(tmp_path, f"hf://{QWEN_DRAFT}/nope.gguf")
    message = target_error(pair)
    assert message == (
        f"target model of pair 'p': {QWEN_DRAFT} has no file nope.gguf; see its files at "
        f"https://huggingface.co/{QWEN_DRAFT}/tree/main "
        f"(set by pairs.p.target in {tmp_path}/models.toml)"
    )


def test_unknown_revision(tmp_path, hub):
    hub.error = RevisionNotFoundError("404 revision")
    pair = pair_from_toml(
        tmp_path,
        f'target = {{ hf = "{QWEN_DRAFT}", file = "{DRAFT_FILE}", revision = "v9" }}\n'
        'draft = "lookup"\n',
    )
    message = target_error(pair)
    assert message.startswith(
        f"target model of pair 'p': {QWEN_DRAFT} has no revision 'v9'"
    )


def test_disk_full_while_downloading(tmp_path, hub):
    message = hub_failure(tmp_path, hub, OSError(errno.ENOSPC, "No space left on device"))
    assert message == (
        f"target model of pair 'p': downloading {QWEN_DRAFT}/{DRAFT_FILE} into "
        "~/.cache/huggingface/hub failed: No space left on device"
    )


def test_other_http_errors_are_one_line(tmp_path, hub):
    message = hub_failure(tmp_path, hub, HfHubHTTPError("500 Server Error\nrequest id: x"))
    assert (
        message
        == f"target model of pair 'p': downloading from {QWEN_DRAFT} failed: 500 Server Error"
    )


def test_unexpected_errors_propagate(tmp_path, hub):
    hub.error = RuntimeError("a bug")
    pair = hf_pair(tmp_path, f"hf://{QWEN_DRAFT}/{DRAFT_FILE}")
    with pytest.raises(RuntimeError, match="a bug"):
        resolve_source(pair.target, pair=pair)


def test_offline_env_wins_without_calling_the_hub(tmp_path, monkeypatch, hub):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pair = hf_pair(tmp_path, f"hf://{QWEN_DRAFT}/{DRAFT_FILE}")
    with pytest.raises(ModelLoadError, match=r"downloads are off \(HF_HUB_OFFLINE=1\)"):
        resolve_source(pair.target, pair=pair)
    assert hub.calls == []


# --------------------------------------------------------------------------- derive from hf


@pytest.fixture
def fake_backend(monkeypatch) -> list:
    calls: list = []

    def quantize(src, dst, ftype, n_threads):
        calls.append((Path(src), ftype))
        Path(dst).write_bytes(b"GGUF" + ftype.encode() + Path(src).read_bytes())

    module = types.ModuleType("specllama.engine.llama")
    module.quantize = quantize
    monkeypatch.setitem(sys.modules, "specllama.engine.llama", module)
    monkeypatch.setattr(specllama.engine, "llama", module, raising=False)
    return calls


def test_a_draft_can_be_derived_from_an_hf_target(tmp_path, hf_cache, fake_backend):
    snapshot = add_to_cache(hf_cache, QWEN_DRAFT, {DRAFT_FILE: GGUF_BYTES})
    pair = hf_pair(
        tmp_path, f"hf://{QWEN_DRAFT}/{DRAFT_FILE}", '{ derive = "target", quant = "Q4_0" }'
    )
    assert source_status(pair) == "ready (in HF cache; the draft is derived on first use)"
    target, draft = resolve_pair(pair)
    assert target == snapshot / DRAFT_FILE
    assert draft.read_bytes() == b"GGUFQ4_0" + GGUF_BYTES
    assert fake_backend == [(target, "Q4_0")]
    assert source_status(pair) == "ready (in HF cache)"


# --------------------------------------------------------------------------- status


def test_status_needs_download_offline(tmp_path):
    pair = hf_pair(tmp_path, f"hf://{QWEN}/*q4_k_m*.gguf", f"hf://{QWEN_DRAFT}/{DRAFT_FILE}")
    assert source_status(pair) == (
        "needs download (target and draft, downloads are off: HF_HUB_OFFLINE=1)"
    )
    assert pending_downloads(pair) == [
        f"target: hf://{QWEN}/*q4_k_m*.gguf",
        f"draft: hf://{QWEN_DRAFT}/{DRAFT_FILE}",
    ]


def test_status_never_calls_the_hub(tmp_path, hf_cache, monkeypatch, online):
    class Untouchable(types.ModuleType):
        def __getattr__(self, name):
            raise AssertionError(f"source_status used huggingface_hub.{name}")

    monkeypatch.setitem(sys.modules, "huggingface_hub", Untouchable("huggingface_hub"))
    add_to_cache(hf_cache, QWEN, {SHARD1: GGUF_BYTES})  # one part of two
    pair = hf_pair(tmp_path, f"hf://{QWEN}/*q4_k_m*.gguf", f"hf://{QWEN_DRAFT}/{DRAFT_FILE}")
    assert (
        source_status(pair) == "needs download (target and draft, from Hugging Face on first use)"
    )
    add_to_cache(hf_cache, QWEN, {SHARD2: GGUF_BYTES})
    add_to_cache(hf_cache, QWEN_DRAFT, {DRAFT_FILE: GGUF_BYTES})
    assert source_status(pair) == "ready (in HF cache)"
    assert pending_downloads(pair) == []


def test_status_of_a_partly_cached_pair(tmp_path, hf_cache, online):
    add_to_cache(hf_cache, QWEN_DRAFT, {DRAFT_FILE: GGUF_BYTES})
    pair = hf_pair(tmp_path, f"hf://{QWEN}/*q4_k_m*.gguf", f"hf://{QWEN_DRAFT}/{DRAFT_FILE}")
    assert source_status(pair) == "needs download (target, from Hugging Face on first use)"
    derived = hf_pair(
        tmp_path, f"hf://{QWEN}/*q4_k_m*.gguf", '{ derive = "target", quant = "Q8_0" }'
    )
    assert source_status(derived) == (
        "needs download (target, from Hugging Face on first use; "
        "the draft is derived from the target)"
    )


def test_status_without_huggingface_hub(tmp_path, monkeypatch, online):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    pair = hf_pair(tmp_path, f"hf://{QWEN_DRAFT}/{DRAFT_FILE}")
    assert source_status(pair) == (
        "needs download (target, needs: pip install 'huggingface-hub>=0.20')"
    )


def test_status_of_a_local_file_missing_beside_an_hf_model(tmp_path, hf_cache):
    add_to_cache(hf_cache, QWEN_DRAFT, {DRAFT_FILE: GGUF_BYTES})
    pair = hf_pair(tmp_path, "t.gguf", f"hf://{QWEN_DRAFT}/{DRAFT_FILE}")
    assert source_status(pair).startswith("missing: target model of pair 'p': file not found")


def test_status_of_the_shipped_hf_pairs_is_offline_and_quick():
    cfg = load_config(packaged_config_path())
    for pair in cfg.pairs.values():
        if pair.target.kind == "hf":
            both = "target and draft" if pair.draft.kind == "hf" else "target"
            assert source_status(pair) == (
                f"needs download ({both}, downloads are off: HF_HUB_OFFLINE=1)"
            )


# --------------------------------------------------------------------------- real models


def test_llama_cpp_loads_tiny_models_from_the_hf_cache(tmp_path, hf_cache, tiny_target, tiny_draft):
    """The snapshot symlinks are what llama.cpp gets, and it loads them."""
    from specllama.engine.decoder import SpeculativeDecoder

    add_to_cache(hf_cache, "tiny/tiny-GGUF", {"tiny-target.gguf": tiny_target})
    add_to_cache(hf_cache, "tiny/tiny-GGUF", {"tiny-draft.gguf": tiny_draft})
    pair = hf_pair(
        tmp_path, "hf://tiny/tiny-GGUF/tiny-target.gguf", "hf://tiny/tiny-GGUF/*draft*.gguf"
    )
    target, draft = resolve_pair(pair)
    assert target.read_bytes() == tiny_target.read_bytes()
    dec = SpeculativeDecoder.load(target, draft, n_ctx=256, n_threads=1, p_min=0.0)
    try:
        assert dec.draft is not None
    finally:
        dec.close()


# --------------------------------------------------------------------------- on the command line


def test_hf_sources_work_in_flags_as_in_the_file(tmp_path, hf_cache, tiny_target):
    """`--target hf://...` is read by the same rules as models.toml (the `//` kept)."""
    from click.testing import CliRunner

    from specllama.cli import cli

    snapshot = add_to_cache(hf_cache, "someone/tiny-GGUF", {"tiny.gguf": tiny_target})

    def run(*args):
        return CliRunner().invoke(cli, ["generate", "Hello", *map(str, args), "--raw", "--json",
                                        "--max-tokens", "2", "--threads", "1", "--n-ctx", "256"])

    ok = run("--target", "hf://someone/tiny-GGUF/tiny.gguf", "--draft", "lookup")
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.startswith("{") and str(snapshot / "tiny.gguf") in ok.stdout
    glob = run("--target", "hf://someone/tiny-GGUF/*.gguf", "--draft", "lookup")
    assert glob.exit_code == 0, glob.output
    missing = run("--target", "hf://someone/tiny-GGUF/other.gguf", "--draft", "lookup")
    assert missing.exit_code == 2 and missing.stdout == ""
    assert missing.stderr == (
        "specllama: error: target model: someone/tiny-GGUF/other.gguf is not in the Hugging "
        "Face cache (~/.cache/huggingface/hub) and downloads are off (HF_HUB_OFFLINE=1); "
        "run: specllama pull hf://someone/tiny-GGUF/other.gguf\n")
    bad = run("--target", "hf://someone", "--draft", "lookup")
    assert bad.exit_code == 2
    assert bad.stderr.startswith('specllama: error: --target: must look like "hf://OWNER/REPO/')
