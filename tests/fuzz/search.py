"""The run: each part's search by hypothesis over a server, then the shrinking of each
kind of failure it found to a minimal request; and the checks after the run (plain
requests still answered, the tracebacks in the server's log)."""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, event, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from .check import check
from .exchange import (
    CHAT,
    COUNT_TOKENS,
    MESSAGES,
    RESPONSES,
    FuzzRequest,
    Problem,
    _json,
    encode,
)
from .kinds import parts
from .report import Report
from .target import Target
from .values import T


class FuzzFailure(AssertionError):
    """A broken promise. Each signature gets its own subclass, so that hypothesis shrinks
    and reports each kind of failure on its own (it tells them apart by type)."""


_KINDS: dict[str, type[FuzzFailure]] = {}


def failure_of(problem: Problem) -> type[FuzzFailure]:
    if problem.signature not in _KINDS:
        name = "Fuzz_" + re.sub(r"\W+", "_", problem.signature)[:60]
        _KINDS[problem.signature] = type(name, (FuzzFailure,), {})
    return _KINDS[problem.signature]


def _hypothesis(strategy: st.SearchStrategy[FuzzRequest], examples: int, seed: int,
                test: Callable[[FuzzRequest], None], shrink: bool) -> str | None:
    """`test` on `examples` requests drawn with `seed`; what hypothesis raised (None:
    nothing failed). Nothing is stored: no example database."""
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, phases=phases,
              suppress_health_check=list(HealthCheck), print_blob=False,
              report_multiple_bugs=True, verbosity=Verbosity.quiet)
    @given(req=strategy)
    def run(req: FuzzRequest) -> None:
        test(req)

    try:
        run()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def fuzz(target: Target, examples: int, *, seed: int = 0, max_tokens: int = 8,
         shrink: bool = True, shrink_runs: int = 4) -> Report:
    """`examples` requests drawn by hypothesis, shared among the kinds of request as
    `parts` says, and what each answer broke, by kind of failure with the smallest
    request that showed it.

    Each part is a search of its own: hypothesis' generation dwells on what it has drawn
    (it draws again requests like the last, more of them the more parts they have alike),
    so one search over all the kinds would spend the budget on the richest. Hypothesis
    stops drawing soon after a first failure, so a search never fails a test: it draws
    all its examples. Then each kind of failure it found is shrunk: hypothesis draws
    the same requests again from the same seed (the server answering as before, it
    meets the same failures at the same places), this time failing on them, and shrinks
    each (it stops drawing soon after the first, so the kinds it has not met by then get
    a run of their own, `shrink_runs` in all)."""
    report = Report(examples, seed)
    # hypothesis keeps caches (not examples: no database) in ./.hypothesis unless told
    with tempfile.TemporaryDirectory(prefix="specllama-hypothesis-") as home:
        set_hypothesis_home_dir(home)
        try:
            for _, count, strategy in split(parts(target.model, max_tokens), examples):
                if count:
                    _fuzz(target, report, strategy, count, shrink, shrink_runs)
        finally:
            set_hypothesis_home_dir(None)
    return report


def split(weighted_parts: list[tuple[str, int, T]], examples: int) -> list[tuple[str, int, T]]:
    """The examples shared in proportion to the weights (rounded, adding up)."""
    total = sum(w for _, w, _ in weighted_parts)
    out, done, cumulative = [], 0, 0
    for name, weight, strategy in weighted_parts:
        cumulative += weight
        upto = round(examples * cumulative / total)
        out.append((name, upto - done, strategy))
        done = upto
    return out


def _fuzz(target: Target, report: Report, strategy: st.SearchStrategy[FuzzRequest],
          examples: int, shrink: bool, shrink_runs: int) -> None:
    """One part's search, then its shrinking."""
    seed, known = report.seed, set(report.found)

    def search(req: FuzzRequest) -> None:
        out = target.send(req)
        report.record(req, out, check(req, out))
        event(f"{req.kind}: {out.status}")

    t0 = time.perf_counter()
    _hypothesis(strategy, examples, seed, search, shrink=False)
    t1 = time.perf_counter()
    report.seconds += t1 - t0
    todo = set(report.found) - known  # what this part found first
    for _ in range(shrink_runs if shrink and todo else 0):
        met: set[str] = set()

        def shrinking(req: FuzzRequest, todo: set[str] = todo, met: set[str] = met) -> None:
            out = target.send(req)
            report.shrink_requests += 1
            for p in check(req, out):
                if p.signature in todo:
                    met.add(p.signature)
                    report.keep(req, out, p, shrunk=True)
                    raise failure_of(p)(f"{p.signature}: {p.detail}\nrequest: {req!r}\n"
                                        f"answer: {out.describe()}")

        raised = _hypothesis(strategy, examples, seed, shrinking, shrink=True)
        if raised:
            report.hypothesis.append(raised[:20_000])
        todo = todo - met
        if not met or not todo:
            break
    report.shrink_seconds += time.perf_counter() - t1


PLAIN_CHAT = {"messages": [{"role": "user", "content": "Hello world"}], "max_tokens": 4}
PLAIN: list[tuple[str, dict[str, Any]]] = [
    (CHAT, PLAIN_CHAT), (RESPONSES, {"input": "Hello world", "max_output_tokens": 4}),
    (MESSAGES, PLAIN_CHAT),
]


def after_run(target: Target, report: Report | None = None) -> list[str]:
    """After the fuzzing: a plain request to each of Chat Completions, Responses and
    Messages still gets 200, a stream its end, count_tokens a count, and /health says ok
    (what is wrong; empty: all well). Kept in `report` when given."""
    wrong = []
    plain = [FuzzRequest("POST", path, encode({"model": target.model, **body, **stream}))
             for path, body in PLAIN for stream in ({}, {"stream": True})]
    plain.append(FuzzRequest("POST", COUNT_TOKENS, encode(
        {"model": target.model, "messages": PLAIN_CHAT["messages"]})))
    for req in plain:
        out = target.send(req)
        if out.status != 200 or check(req, out):
            wrong.append(f"{req!r} -> {out.describe()}")
    health = target.send(FuzzRequest("GET", "/health", content_type=None))
    if health.status != 200 or (_json(health.text) or {}).get("status") != "ok":
        wrong.append(f"GET /health -> {health.describe()}")
    if report is not None:
        report.after = wrong
    return wrong


def tracebacks(log: Sequence[str]) -> list[str]:
    """Each traceback in a server's log, from its first line to the exception's."""
    found, lines = [], list(log)
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            end = next((j for j in range(i + 1, len(lines))
                        if not lines[j].startswith((" ", "Traceback", "\n"))), len(lines) - 1)
            found.append("".join(lines[max(0, i - 1):end + 1]).rstrip())
    return found
