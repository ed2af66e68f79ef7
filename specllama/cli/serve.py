"""`specllama serve`: the pair behind an OpenAI-compatible HTTP API (specllama/server)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from .. import server
from .options import (
    RunOptions,
    measure_costs,
    model_options,
    open_decoder,
    run_options,
    sampling_options,
)
from .ui import stats_table, stderr_console


@click.command()
@model_options
@sampling_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: any free port).")
@click.option("--api-key", envvar="SPECLLAMA_API_KEY",
              help="Require 'Authorization: Bearer KEY' (also $SPECLLAMA_API_KEY).")
@click.option("--queue", "max_waiting", default=8, show_default=True,
              type=click.IntRange(0, 1024),
              help="Requests that may wait behind the one being served; more get 503.")
@run_options
def serve(run: RunOptions, host: str, port: int, api_key: str | None, max_waiting: int) -> None:
    """Serve the pair over an OpenAI-compatible HTTP API (/v1/chat/completions,
    /v1/completions, /v1/models, /health) until Ctrl-C."""
    err = stderr_console()
    if not server.is_loopback(host) and not api_key:
        err.print(f"[yellow]warning:[/yellow] serving on {escape(host)} without "
                  "--api-key: anyone who can reach this machine can use it")
    # Bind before loading: a taken port fails in a second, not after the models load.
    sock = server.listen(host, port)
    decoder, settings = open_decoder(run, err, calibrate=False)
    try:
        model_id = settings.pair or Path(settings.target).stem
        config = server.ServeConfig(
            model_id=model_id,
            defaults=server.Defaults(settings.sampling, settings.max_tokens,
                                     settings.constraint),
            draft_max=settings.draft_max,
            draft_mode=settings.draft_mode,
            api_key=api_key,
            max_waiting=max_waiting,
            target=Path(settings.target).name,
            draft=Path(settings.draft).name,
        )
        def measure() -> None:  # on the thread that decodes (server/worker.py)
            measure_costs(decoder, settings.draft_max, run.recalibrate,
                          lambda why: err.print(why, style="dim", markup=False))

        totals = server.serve(
            decoder, config, sock, prepare=measure,
            on_ready=lambda url: err.print(f"serving {model_id} at {url}/v1 (Ctrl-C stops)",
                                           markup=False),
            log=lambda line: err.print(line, markup=False, style="dim"),
        )
    finally:
        decoder.close()
    t = totals
    err.print(f"stopped: {t.completed} completed, {t.cancelled} cancelled, {t.failed} failed, "
              f"{t.rejected} turned away (503)")
    if t.stats.target_steps:
        err.print(stats_table(t.stats, title="all requests"))
