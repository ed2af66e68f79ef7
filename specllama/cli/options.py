"""The flags shared by `generate`, `chat`, `bench` and `serve`, built from the settings
table (engine/settings.py), and gathered into a RunOptions (loading.py opens the pair
it names)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..engine.settings import LIVE_SETTINGS, SETTINGS
from ..loading import RunOptions

F = TypeVar("F", bound=Callable[..., Any])


class IntOrWord(click.ParamType):
    """An integer, or one of a setting's words ('auto', ...); the table checks the range."""

    name = "N|auto"

    def __init__(self, words: tuple[str, ...]) -> None:
        self.words = words

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) or value in self.words:
            return value
        try:
            return int(value)
        except (TypeError, ValueError):
            said = ", ".join(f"'{w}'" for w in self.words)
            self.fail(f"expected an integer or {said}, got {value!r}", param, ctx)


def setting_option(name: str) -> Callable[[F], F]:
    """The flag of one setting, from the settings table. It has no click default:
    an absent flag leaves the pair's default (or the table's) in force."""
    s = SETTINGS[name]
    kind: Any = s.type
    if s.type is tuple:
        return click.option(s.flag, name, metavar=s.metavar or "HOST:PORT", multiple=True,
                            help=s.help)
    if s.metavar:
        return click.option(s.flag, *s.aliases, name, metavar=s.metavar, help=s.help)
    if s.type is bool:  # None when absent, like every other setting's flag
        return click.option(s.flag, name, is_flag=True, flag_value=True, default=None,
                            help=s.help)
    if s.type is int and s.words:
        kind = IntOrWord(s.words)
    elif s.type is str:
        kind = click.Choice(s.words)
    shown = "" if s.default is None else f" [default {s.default}]"
    return click.option(s.flag, *s.aliases, name, type=kind, help=s.help + shown)


def settings_markdown() -> str:
    """The settings table as the README shows it (a test keeps the two in step)."""
    rows = ["| flag | models.toml / `/set` | default | meaning |", "| --- | --- | --- | --- |"]
    for s in SETTINGS.values():
        where = ", ".join(w for w, ok in (("[defaults]", s.in_file), ("/set", not s.at_load))
                          if ok) or "-"
        shown = "-" if s.default is None or s.default == () else f"`{s.default}`"
        flags = ", ".join(f"`{f}`" for f in (s.flag, *s.aliases))
        rows.append(f"| {flags} | {where} | {shown} | {s.help} |")
    return "\n".join(rows)


def _apply(f: F, decorators: list[Callable[[F], F]]) -> F:
    for decorator in reversed(decorators):
        f = decorator(f)
    return f


def model_options(f: F) -> F:
    """--pair/--config or --target/--draft, plus the settings fixed at load."""
    return _apply(f, [
        click.option("--pair", "pair_name", metavar="NAME", help="Model pair from models.toml."),
        click.option("--config", "config_path", metavar="FILE", help="models.toml to use."),
        click.option("--target", metavar="GGUF", help="Target model file (instead of --pair)."),
        click.option(
            "--draft", metavar="GGUF|lookup",
            help="Draft model file (a Gemma 4 assistant too), or 'lookup' for none (the "
                 "default with --target: the target drafts for itself, by lookup and its "
                 "MTP layers if it has them)."
        ),
        *(setting_option(n) for n, s in SETTINGS.items() if s.at_load),
    ])


RECALIBRATE_OPTION = click.option(
    "--recalibrate",
    is_flag=True,
    help="Measure decode costs again for --draft-max auto instead of using the cached "
    "ones (after a busy spell, or new hardware settings).",
)


def sampling_options(f: F) -> F:
    """Every setting that can change while the models stay loaded."""
    return _apply(f, [*(setting_option(n) for n in LIVE_SETTINGS), RECALIBRATE_OPTION])


def view_options(f: F) -> F:
    """How replies are shown: the live drafts view of the seed demo. Display only, so
    not in the settings table (the engine never renders)."""
    return _apply(f, [
        click.option(
            "--show-drafts",
            is_flag=True,
            help="On a terminal, show each round's drafts as they are proposed (blue), then "
            "the verdict: accepted green, rejected struck through, the target's token yellow.",
        ),
        click.option(
            "--pace",
            type=click.IntRange(min=0),
            default=0,
            metavar="MS",
            help="Pause MS milliseconds after the drafts appear and after each verdict, to "
            "follow it by eye (implies --show-drafts; timings then include the pauses).",
        ),
    ])


_MODEL_FLAGS = ("pair_name", "config_path", "target", "draft", "recalibrate")


def run_options(f: Callable[..., None]) -> Callable[..., None]:
    """Gather a command's model and setting flags into its first argument, a RunOptions;
    the command's own options stay keyword arguments."""

    @functools.wraps(f)
    def wrapper(**kwargs: Any) -> None:
        flags = tuple((name, value) for name in SETTINGS
                      if (value := kwargs.pop(name, None)) is not None and value != ())
        models = {name: kwargs.pop(name) for name in _MODEL_FLAGS if name in kwargs}
        f(RunOptions(**models, flags=flags), **kwargs)

    return wrapper
