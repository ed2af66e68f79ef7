"""What the bench scripts share: the pair they run (resolved as `specllama` resolves it),
the options every one takes, the spread of repeated figures and the machine's name.

A script's entry is `run(main)`: specllama's own errors (a pair that does not exist, a
missing file) end it with one line and exit status 2, as they end a `specllama` command.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specllama import SpeculativeDecoder

#: `specllama` in the Python running the script (`python -m specllama` has no __main__).
SPECLLAMA = [sys.executable, "-c", "from specllama.cli import main; main()"]


# ------------------------------------------------------------------------------ options


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A script's parser, described by the first paragraph of its docstring, its usage
    the command that runs it."""
    script = Path(sys.argv[0])
    prog = f"python -m bench.{script.stem}" if script.parent.name == "bench" else None
    return argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n\n")[0])


def add_pair_options(p: argparse.ArgumentParser, *, pair: str = "smollm2-f32",
                     threads: int | None = 2) -> None:
    """--pair (or --target/--draft), --config and --threads, as `specllama` takes them."""
    p.add_argument("--pair", default=pair, help="a pair of models.toml (default: %(default)s)")
    p.add_argument("--config", help="the models.toml to read (default: specllama's search)")
    p.add_argument("--target", help="a target GGUF (with --draft, instead of --pair)")
    p.add_argument("--draft", help="its draft: a GGUF, or 'lookup' (with --target)")
    p.add_argument("--threads", type=int, default=threads,
                   help="threads per model (default: %(default)s)")


def add_run_options(p: argparse.ArgumentParser, *, reps: int | None = None,
                    max_tokens: int | None = None, temperature: float | None = None,
                    json: bool = False) -> None:
    """--reps, --max-tokens, --temperature and --json, those the script has (a default
    given, or json True)."""
    if reps is not None:
        p.add_argument("--reps", type=int, default=reps,
                       help="repetitions (default: %(default)s)")
    if max_tokens is not None:
        p.add_argument("--max-tokens", type=int, default=max_tokens,
                       help="tokens per generation (default: %(default)s)")
    if temperature is not None:
        p.add_argument("--temperature", type=float, default=temperature,
                       help="0 = greedy (default: %(default)s)")
    if json:
        p.add_argument("--json", type=Path, help="write every figure here as JSON")


def model_flags(args: argparse.Namespace) -> list[str]:
    """The pair as flags of another specllama command (`bench`, `serve`)."""
    if args.target:
        return ["--target", str(args.target), "--draft", str(args.draft)]
    return ["--pair", args.pair, *(["--config", args.config] if args.config else [])]


# ------------------------------------------------------------------------------ models


def resolve_models(args: argparse.Namespace, *, need_draft: bool = False,
                   ) -> tuple[Path, Path | None]:
    """The target's and draft's files (None: a lookup draft), as `specllama` resolves
    --pair or --target/--draft (those of them `args` has): a derived draft from the
    cache, a Hugging Face download."""
    from specllama.errors import InvalidParameterError
    from specllama.loading import RunOptions, choose_models

    target, threads = getattr(args, "target", None), getattr(args, "threads", None)
    options = RunOptions(pair_name=None if target else args.pair,
                         config_path=getattr(args, "config", None), target=target,
                         draft=getattr(args, "draft", None),
                         flags=(("threads", threads),) if threads else ())
    choice = choose_models(options, lambda message: print(message, file=sys.stderr))
    if need_draft and choice.draft is None:
        raise InvalidParameterError(f"{args.target or args.pair}: this script needs a draft "
                                    "model, and the pair drafts by lookup")
    return choice.target, choice.draft


def load_decoder(args: argparse.Namespace, *, n_ctx: int = 2048, need_draft: bool = False,
                 **kwargs: Any) -> SpeculativeDecoder:
    """The pair's decoder, each model on --threads threads."""
    from specllama import SpeculativeDecoder

    target, draft = resolve_models(args, need_draft=need_draft)
    return SpeculativeDecoder.load(target, draft if draft is not None else "lookup",
                                   n_ctx=n_ctx, n_threads=args.threads, **kwargs)


def run(main: Callable[[], None]) -> None:
    """Run a script's main; specllama's errors as one line, exit status 2."""
    from specllama.errors import SpecLlamaError

    try:
        main()
    except SpecLlamaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


# ------------------------------------------------------------------------------ figures


@dataclass(frozen=True)
class Spread:
    """Repeated measurements of one figure: the median and the extremes."""

    min: float
    median: float
    max: float

    @classmethod
    def of(cls, xs: Sequence[float]) -> Spread:
        if not xs:
            raise ValueError("no measurements")
        return cls(min(xs), statistics.median(xs), max(xs))

    def bracket(self, digits: int = 2) -> str:
        """'1.23 [1.10-1.40]'."""
        return f"{self.median:.{digits}f} [{self.min:.{digits}f}-{self.max:.{digits}f}]"

    def slashed(self, digits: int = 3) -> str:
        """'1.100 / 1.230 / 1.400' (min / median / max)."""
        return f"{self.min:.{digits}f} / {self.median:.{digits}f} / {self.max:.{digits}f}"

    def as_dict(self) -> dict[str, float]:
        return {"min": self.min, "median": self.median, "max": self.max}


def geomean(xs: Sequence[float]) -> float:
    """Geometric mean of the positive values (0 without any)."""
    kept = [x for x in xs if x > 0]
    return math.exp(sum(map(math.log, kept)) / len(kept)) if kept else 0.0


def percentile(xs: Sequence[float], q: float) -> float | None:
    """The nearest-rank q-th percentile (None without values)."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def ratios(xs: Sequence[float], base: Sequence[float]) -> list[float]:
    """xs / base, pairwise: each within one repetition, so the machine's drift cancels."""
    return [x / b for x, b in zip(xs, base, strict=True)]


def machine() -> str:
    """The CPU and its core count, for the report."""
    from specllama.policy.calibration import cpu_model

    return f"{cpu_model()} ({os.cpu_count()} cores)"
