"""`specllama serve`: the pair behind an OpenAI-compatible HTTP API (specllama/server)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Literal

import click
from click.core import ParameterSource
from rich.markup import escape

from .. import server
from ..console import stderr_console
from ..engine.llama import Vocabulary
from ..loading import RunOptions, serve_engine
from ..server.guard import origin_patterns
from ..server.promptcache import beyond_memory
from .options import model_options, run_options, sampling_options
from .ui import stats_table


def _origins(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
             ) -> tuple[str, ...]:
    try:
        return origin_patterns(values)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _cache_mib(ctx: click.Context, param: click.Parameter, mib: int) -> int:
    # Refused, not capped: copies beyond the free memory end with the OOM killer taking
    # the engine (and them) mid-request. The default is left alone: the cache fills lazily.
    if ctx.get_parameter_source(param.name or "") is not ParameterSource.DEFAULT:
        why = beyond_memory(mib << 20)
        if why is not None:
            raise click.BadParameter(why)
    return mib


@click.command()
@model_options
@sampling_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: any free port).")
@click.option("--api-key", envvar="SPECLLAMA_API_KEY",
              help="Require 'Authorization: Bearer KEY' (also $SPECLLAMA_API_KEY).")
@click.option("--allowed-origins", "allowed_origins", multiple=True, metavar="ORIGINS",
              envvar="SPECLLAMA_ALLOWED_ORIGINS", callback=_origins,
              help="Web pages that may call the API from a browser: origins "
                   "(scheme://host[:port], '*' matching any text; '*' alone: any page), "
                   "comma-separated or repeated (also $SPECLLAMA_ALLOWED_ORIGINS). This "
                   "server's own origins are always allowed; others get 403.")
@click.option("--queue", "max_waiting", default=8, show_default=True,
              type=click.IntRange(0, 1024),
              help="Requests that may wait behind the one being served; more get 503.")
@click.option("--parallel", default=1, show_default=True, type=click.IntRange(1, 16),
              help="Requests served at once: each a sequence of one target context, their "
                   "rounds verified in one batch.")
@click.option("--cache-mib", default=1024, show_default=True, type=click.IntRange(0, 1 << 20),
              callback=_cache_mib,
              help="Memory for copies of earlier requests' KV caches, so a prompt that "
                   "shares a long prefix with one of them is not evaluated again (0: off).")
@click.option("--reasoning-format", type=click.Choice(["none", "auto"]), default="auto",
              show_default=True,
              help="Where a reasoning model's thinking goes: 'auto' splits it off the "
                   "answer where the chat template marks it (<think>, gpt-oss channels) "
                   "and constrains only the answer; 'none' leaves it in the answer text.")
@run_options
def serve(run: RunOptions, host: str, port: int, api_key: str | None,
          allowed_origins: tuple[str, ...], max_waiting: int, parallel: int,
          cache_mib: int, reasoning_format: Literal["none", "auto"]) -> None:
    """Serve the pair over HTTP until Ctrl-C: OpenAI's Chat Completions, Completions and
    Responses APIs, Anthropic's Messages API (/v1/chat/completions, /v1/completions,
    /v1/responses, /v1/messages), /v1/models, /health and /metrics."""
    err = stderr_console()
    if not server.is_loopback(host) and not api_key:
        err.print(f"[yellow]warning:[/yellow] serving on {escape(host)} without "
                  "--api-key: anyone who can reach this machine can use it")
    # Bind before loading: a taken port fails in a second, not after the models load.
    sock = server.listen(host, port)
    # The models live in an engine process that may die (a lost RPC server) and is
    # started again; this process keeps the HTTP side and the target's vocabulary.
    # SPECLLAMA_SERVE_IN_PROCESS=1: the models in this process (bench/isolation.py's
    # baseline for what the isolation costs).
    # --parallel N is read once, by the loading: N sequences per model, then N slots.
    decoding: server.Slots | server.EngineProcess
    process: server.EngineProcess | None = None  # its settings come once it has loaded
    if os.environ.get("SPECLLAMA_SERVE_IN_PROCESS") == "1":
        decoder, measure, settings = serve_engine(run, True, parallel=parallel)
        decoding = server.Slots(decoder, measure, cache_mib << 20)
    else:
        decoding = process = server.EngineProcess(
            functools.partial(serve_engine, run, parallel=parallel), cache_mib << 20)
    try:
        if process is not None:
            settings = process.start()
        vocab = Vocabulary(settings.target)
        model_id = settings.pair or Path(settings.target).stem
        config = server.ServeConfig(
            model_id=model_id,
            defaults=server.Defaults(settings.sampling, settings.max_tokens,
                                     settings.constraint, reasoning_format),
            draft_max=settings.draft_max,
            drafters=settings.drafters,
            n_ctx=settings.n_ctx,
            api_key=api_key,
            max_waiting=max_waiting,
            parallel=decoding.parallel,
            target=Path(settings.target).name,
            draft=Path(settings.draft).name,
            host=host,
            allowed_origins=allowed_origins,
        )
        totals = server.serve(
            decoding, vocab, config, sock,
            on_ready=lambda url: err.print(f"serving {model_id} at {url}/v1 (Ctrl-C stops)",
                                           markup=False),
            log=lambda line: err.print(line, markup=False, style="dim"),
        )
    finally:
        decoding.close()
        sock.close()
    t = totals
    err.print(f"stopped: {t.completed} completed, {t.cancelled} cancelled, {t.failed} failed, "
              f"{t.rejected} turned away (503)")
    if t.stats.target_steps:
        err.print(stats_table(t.stats, title="all requests"))
