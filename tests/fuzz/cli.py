"""The command line, `python -m tests.fuzz`: its options, and the server it fuzzes (one it
starts, or --url's)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from .report import Report
from .search import after_run, fuzz, tracebacks
from .target import Target


def arguments_parser() -> argparse.ArgumentParser:
    from bench.lib.common import add_pair_options, parser

    # described by the package's docstring; named as run (common.parser names a script
    # by its file, here __main__.py): tests.fuzz from the root, fuzz from tests/
    p = parser(sys.modules[__package__].__doc__)
    p.prog = f"python -m {__package__}"
    p.add_argument("--examples", type=int, default=1000, help="requests hypothesis draws "
                   "(more are sent while it shrinks a failure; default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="hypothesis' seed (default: 0)")
    p.add_argument("--max-tokens", type=int, default=8,
                   help="the most a well-formed request asks for, and serve's default "
                   "(default: %(default)s)")
    p.add_argument("--no-shrink", action="store_true",
                   help="report failures as found, not shrunk to a minimal request")
    add_pair_options(p, pair="smollm2", threads=2)
    p.add_argument("--serve-args", default="", help="more flags for specllama serve")
    p.add_argument("--url", help="fuzz this server, already running, instead of starting one")
    p.add_argument("--api-key", default=os.environ.get("SPECLLAMA_API_KEY"),
                   help="the key of the server at --url (default: $SPECLLAMA_API_KEY)")
    p.add_argument("--timeout", type=float, default=120, help="seconds a request may take")
    p.add_argument("--json", type=Path, help="write the figures and failures here")
    return p


def main() -> None:
    p = arguments_parser()
    args = p.parse_args()
    if bool(args.target) != bool(args.draft):
        p.error("--target and --draft go together")
    command = shlex.join([Path(sys.executable).name, *sys.argv])
    print(f"command: {command}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.url:
        target = Target(args.url, "", timeout=args.timeout, api_key=args.api_key)
        target.model = target.http.get(target.url + "/v1/models").json()["data"][0]["id"]
        report = run_on(target, args)
    else:
        report = run_serving(args)
    print("\n".join(report.lines()))
    if args.json:
        args.json.write_text(json.dumps({"command": command, **report.as_dict()}, indent=1))
    sys.exit(1 if report.failed else 0)


def run_on(target: Target, args: argparse.Namespace,
           log: Callable[[], Sequence[str]] | None = None) -> Report:
    report = fuzz(target, args.examples, seed=args.seed, max_tokens=args.max_tokens,
                  shrink=not args.no_shrink)
    after_run(target, report)
    if log is not None:
        report.tracebacks = tracebacks(log())
    target.close()
    return report


def run_serving(args: argparse.Namespace) -> Report:
    from bench.lib.common import machine, model_flags
    from bench.lib.processes import Serve

    argv = [*model_flags(args), "--threads", str(args.threads), "--max-tokens",
            str(args.max_tokens), *shlex.split(args.serve_args)]
    print(f"cpu: {machine()}\nserve: {shlex.join(argv)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="specllama-fuzz-") as tmp:
        serve = Serve(argv, env={"SPECLLAMA_API_KEY": None}, log=Path(tmp) / "serve.log")
        try:
            print(f"serving {serve.model} at {serve.url}", flush=True)
            return run_on(Target(serve.url, serve.model, serve.lines, timeout=args.timeout),
                          args, lambda: serve.lines)
        finally:
            serve.stop()
