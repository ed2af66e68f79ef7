"""The one settings table: docs/usage.md, the flags, the API and SamplingParams agree with it."""

import inspect
import json
from pathlib import Path

import pytest

from specllama import InvalidParameterError, SamplingParams, SpeculativeDecoder
from specllama.cli import cli
from specllama.cli.options import settings_markdown
from specllama.engine.settings import (
    FILE_SETTINGS,
    LIVE_SETTINGS,
    SETTINGS,
    show,
    validate_setting,
)
from specllama.loading import RunSettings
from specllama.models.config import load_config

USAGE = Path(__file__).resolve().parent.parent / "docs" / "usage.md"


def test_the_usage_page_lists_the_table():
    assert settings_markdown() in USAGE.read_text(), (
        "docs/usage.md's settings table is out of date: paste in the output of "
        "python -c 'from specllama.cli.options import settings_markdown; "
        "print(settings_markdown())'")


def test_every_setting_is_a_flag_of_generate_chat_and_bench():
    every = {s.flag for s in SETTINGS.values()}
    for command, missing in (("generate", set()), ("chat", set()),
                             ("bench", {"--draft-max"})):  # the bench has --modes instead
        flags = {opt for p in cli.commands[command].params for opt in p.opts}
        assert every - flags == missing, command


def test_the_api_defaults_are_the_table_defaults():
    load = inspect.signature(SpeculativeDecoder.load).parameters
    stream = inspect.signature(SpeculativeDecoder.stream).parameters
    assert load["n_ctx"].default == SETTINGS["n_ctx"].default
    assert load["n_threads"].default == SETTINGS["threads"].default
    assert load["p_min"].default == SETTINGS["p_min"].default
    assert stream["max_tokens"].default == SETTINGS["max_tokens"].default
    assert stream["draft_max"].default == SETTINGS["draft_max"].default
    sampling = SamplingParams()
    for name in ("temperature", "top_k", "top_p", "min_p", "seed"):
        assert getattr(sampling, name) == SETTINGS[name].default, name


def test_models_toml_and_set_take_the_table_settings():
    assert "drafters" in LIVE_SETTINGS and "n_ctx" not in LIVE_SETTINGS
    assert "rpc" not in FILE_SETTINGS  # given per target in models.toml


def test_every_setting_reaches_models_toml_and_the_run_settings(tmp_path):
    """A setting added to the table alone is taken by [defaults] and kept by RunSettings
    (its flag: test_every_setting_is_a_flag_...; /set: test_chat; --json: test_cli)."""
    def sample(s):  # a valid value that is not the default where the default is empty
        # (absolute paths: the file's relative ones are taken relative to it)
        if s.type is tuple:
            return ("/docs",)
        if s.name == "drafters":  # names, in order
            return ("lookup",)
        if s.default is None:
            return "/x" if s.type is str else 1
        return s.default

    values = {n: sample(SETTINGS[n]) for n in FILE_SETTINGS}
    path = tmp_path / "models.toml"
    path.write_text('[pairs.p]\ntarget = "t.gguf"\ndraft = "d.gguf"\n[pairs.p.defaults]\n'
                    + "".join(f"{n} = {json.dumps(list(v)) if isinstance(v, tuple) else show(v)}\n"
                              for n, v in values.items()))
    defaults = load_config(path).pair("p").defaults
    assert defaults.as_dict() == values
    settings = defaults.over(RunSettings())
    assert {n: getattr(settings, n) for n in FILE_SETTINGS} == values
    assert set(SETTINGS) <= set(settings.as_dict())


@pytest.mark.parametrize("name, value", [
    ("temperature", 0.0), ("temperature", -0.01), ("top_k", 0), ("top_k", -1),
    ("top_p", 1.0), ("top_p", 0.0), ("top_p", 1.01), ("min_p", 0.0), ("min_p", 1.0),
    ("min_p", 1.5), ("seed", 0), ("seed", -1),
])
def test_sampling_params_and_the_table_accept_the_same_values(name, value):
    try:
        validate_setting(name, value)
        table_ok = True
    except InvalidParameterError:
        table_ok = False
    try:
        SamplingParams(**{name: value})
        params_ok = True
    except InvalidParameterError:
        params_ok = False
    assert table_ok == params_ok
