"""Driving drafters by hand in tests: a fixed draft-length policy and requests for drafts."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from specllama.engine.constraint import Constraint
from specllama.engine.drafting.base import Ask, DraftStep, always_more
from specllama.engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


class Lengths:
    """A fixed policy: k per source (one int for all, or a dict; a source it lacks gets 0),
    a stop rule `extend` (default: run to k), and the sources it was asked about."""

    def __init__(self, k: int | dict[str, int] = 4,
                 extend: Callable[[int, float], DraftStep] = always_more) -> None:
        self.k = k
        self.extend = extend
        self.asked: list[str] = []

    def choose(self, source: str = "model", match: int = 0) -> int:
        self.asked.append(source)
        return self.k if isinstance(self.k, int) else self.k.get(source, 0)

    def may_draft(self, source: str = "model", behind: int = 0) -> bool:
        return True


def ask(context: Sequence[int], k: int | dict[str, int] | Lengths = 4, *,
        params: SamplingParams = GREEDY, rng: np.random.Generator | None = None,
        constraint: Constraint | None = None, room: int = 64) -> Ask:
    """A request for a draft after `context`, k tokens at most (or as `k` says)."""
    lengths = k if isinstance(k, Lengths) else Lengths(k)
    return Ask(list(context), room, lengths, params,
               rng if rng is not None else np.random.default_rng(0), constraint)


def proposal(index, k: int) -> list[int]:
    """What an n-gram index alone drafts: k tokens after its match (none without one)."""
    found = index.match()
    return index.continuation(found[0], k) if found is not None and k > 0 else []


def cli_report(target, draft, prompt: str) -> dict:
    """`generate --json` of a pair's model drafts (k = 3, greedy), as a user runs it."""
    import json

    from click.testing import CliRunner

    from specllama.cli import cli

    result = CliRunner().invoke(cli, ["generate", prompt, "--raw", "--target", str(target),
                                      "--draft", str(draft), "--max-tokens", "24",
                                      "--draft-max", "3", "--drafters", "model",
                                      "--temperature", "0", "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def drafting_ahead(dec, monkeypatch) -> None:
    """`dec`'s draft model drafting ahead on a thread of its own while the target
    verifies (drafting/ahead.py). The target's decode is slowed to several of the
    draft's steps, as a laptop-class target's is, so that tokens are drawn ahead however
    busy the machine is."""
    decode = dec.target.decode

    def slow(tokens, logits="last"):
        decode(tokens, logits)
        time.sleep(0.0003)

    monkeypatch.setattr(dec.target, "decode", slow)
    dec.set_threads(2, 1)
    # Drafting in turn on one thread too: ggml's two threads spin-wait for each other,
    # which on two busy cores made the tests ten times slower. What is tested, the draws
    # made ahead on a thread of their own, does not depend on it.
    dec.draft.set_threads(1)
