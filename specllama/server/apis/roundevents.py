"""One turn's engine events as the round-event stream's SSE events (roundstream.py), and the
turn's trace in the format `specllama generate --trace FILE.json` writes.

Each event is named after the seed's picture and carries one engine event: `proposed`
(DraftProposed: blue; `origins` says where each token came from, "prediction" for the
request's own prediction), `accepted` (TokensAccepted: green), `rejected` (the drafts the
target turned down, before its correction), `correction` (TargetToken: yellow; `kind`
says correction, bonus or plain), `figures` (after each RoundVerified; the last one,
`final`, with the turn's figures, its comparison with the target alone and its trace).
Token texts are each token's own share of the text (TokenTexts), as the trace shows them.
"""

from __future__ import annotations

from collections.abc import Callable

from ... import (
    DraftProposed,
    GenerationResult,
    RoundVerified,
    TargetToken,
    TokensAccepted,
)
from ...engine.loop.textstream import TokenTexts
from ...policy.compare import Comparison
from .base import SSE, Body, dumps

#: The trace format `generate --trace` writes (cli/trace.py's TRACE_FORMAT; the server
#: may not import the CLI: the layers point one way).
TRACE_FORMAT = "specllama-trace/1"


def sse(name: str, body: Body) -> SSE:
    return {"event": name, "data": dumps(body)}


def comparison_body(c: Comparison | None, drafted: int, note: str) -> Body | None:
    """The run against the target alone (policy/compare.py), with the line the CLI
    prints (`note`: the policy's, why speculation was off)."""
    if c is None:
        return None
    return {"verdict": c.verdict, "speedup": c.speedup, "alone_tok_s": c.alone_tok_s,
            "predicted": c.predicted, "line": c.line(note if not drafted else "")}


def policy_note(result: GenerationResult) -> str:
    """The machine's note as `specllama chat` says it (speculation off: why)."""
    note = result.stats.policy_note
    if not note:
        return ""
    return note if result.stats.drafted else f"speculation off: the target decodes alone ({note})"


class TurnEvents:
    """One turn: engine events in, SSE events out; the rounds kept for its trace."""

    def __init__(self, piece: Callable[[int], bytes]) -> None:
        self._texts = TokenTexts(piece)
        self.rounds: list[Body] = []
        self.comparison: Comparison | None = None
        self._proposed: tuple[int, ...] = ()
        self._accepted: list[str] = []  # this round's accepted drafts' texts
        self._rest: list[str] = []  # this round's drafts past them (rejected or unused)
        self._target: str | None = None  # the target's own token's text, this round
        self._totals = {"target_steps": 0, "tokens": 0, "drafted": 0, "accepted": 0}
        self._seconds = 0.0

    def feed(self, item: object) -> list[SSE]:
        """One item a job handed over; what is not an event of the turn sends nothing."""
        n = len(self.rounds) + 1
        if isinstance(item, DraftProposed):
            self._proposed = item.tokens
            return [sse("proposed", {"round": n, "tokens": list(item.tokens), "source":
                                     item.source, "origins": list(item.origins),
                                     "texts": self._texts.peek(item.tokens)})]
        if isinstance(item, TokensAccepted):
            texts = self._texts.take(item.tokens)
            self._accepted += texts
            return [sse("accepted", {"round": n, "tokens": list(item.tokens), "texts": texts,
                                     "text": item.text})]
        if isinstance(item, TargetToken):
            return self._target_token(n, item)
        if isinstance(item, RoundVerified):
            return [self._verified(n, item)]
        if isinstance(item, Comparison):
            self.comparison = item
        return []

    def _target_token(self, n: int, item: TargetToken) -> list[SSE]:
        # Before the target's token is taken: the rejected drafts' texts follow the
        # accepted ones, not it.
        self._rest = self._texts.peek(self._proposed[len(self._accepted):])
        self._target = self._texts.take((item.token,))[0]
        out = []
        if item.kind == "correction" and self._rest:
            rejected = self._proposed[len(self._accepted):]
            out.append(sse("rejected", {"round": n, "tokens": list(rejected),
                                        "texts": self._rest}))
        out.append(sse("correction", {"round": n, "token": item.token, "text": self._target,
                                      "kind": item.kind}))
        return out

    def _verified(self, n: int, ev: RoundVerified) -> SSE:
        shown = min(ev.accepted, ev.emitted)
        if self._target is None:  # cut short (end of generation): nothing was taken after
            self._rest = self._texts.peek(ev.drafted[shown:])
        self.rounds.append(ev.record(n, self._accepted + self._rest, self._target))
        t = self._totals
        t["target_steps"] += 1
        t["tokens"] += ev.emitted
        t["drafted"] += ev.k
        t["accepted"] += ev.m
        self._seconds += ev.seconds
        self._proposed, self._accepted, self._rest, self._target = (), [], [], None
        return sse("figures", {"round": n, **t, **_rates(t, self._seconds), "final": False})

    def final(self, result: GenerationResult, extra: Body, settings: Body,
              label: str | None) -> SSE:
        """The turn's last event: the server's figures (`extra`, as every API's
        `speculative`), the note, the comparison, the answer's text and the trace."""
        s = result.stats
        note = policy_note(result)
        generation = {"label": label, "text": result.text, "finish_reason": result.finish_reason,
                      "prompt_tokens": result.prompt_tokens, "stats": s.to_dict(),
                      "rounds": self.rounds}
        trace = {"format": TRACE_FORMAT, "settings": settings, "stats": s.to_dict(),
                 "generations": [generation]}
        return sse("figures", {
            "round": len(self.rounds), "target_steps": s.target_steps, "tokens": s.tokens,
            "drafted": s.drafted, "accepted": s.accepted,
            "tokens_per_step": round(s.tokens_per_step, 4),
            "tokens_per_s": round(s.tokens_per_s, 2), "final": True,
            "finish_reason": result.finish_reason, "text": result.text, "note": note,
            "comparison": comparison_body(self.comparison, s.drafted, s.policy_note or ""),
            "speculative": extra, "trace": trace,
        })


def _rates(t: dict[str, int], seconds: float) -> Body:
    steps = t["target_steps"]
    return {"tokens_per_step": round(t["tokens"] / steps, 4) if steps else 0.0,
            "tokens_per_s": round(t["tokens"] / seconds, 2) if seconds > 0 else 0.0}
