"""Response bodies in OpenAI's shapes, plus specllama's figures under one extra key.

Standard clients ignore the extra key `speculative`; the `openai` client keeps it
(`completion.model_extra["speculative"]`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from .. import GenerationResult
from .prompts import Work
from .tools import OPEN, parse_calls

EXTRA_KEY = "speculative"

# The engine's reasons -> OpenAI's values ("stop": a natural end or a stop string).
FINISH_REASONS = {
    "eos": "stop",
    "stop": "stop",
    "length": "length",
    "context": "length",
    "interrupted": "stop",
}


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(result: GenerationResult) -> dict[str, Any]:
    completion = len(result.tokens)
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.prompt_tokens + completion,
        # OpenAI's name for prompt tokens served from a cache: here, the KV caches.
        "prompt_tokens_details": {"cached_tokens": result.stats.prompt_reused},
    }


def figures(
    result: GenerationResult, *, draft_max: int | str, drafters: tuple[str, ...],
    queue_s: float
) -> dict[str, Any]:
    """What speculation did for this request."""
    s = result.stats
    return {
        "target_steps": s.target_steps,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "acceptance_rate": round(s.acceptance_rate, 4),
        "acceptance_by_position": [round(a, 4) for a in s.acceptance_by_position],
        # tokens a response_format forced (drafted free of any model), apart from drafted
        "forced": s.forced,
        "forced_accepted": s.forced_accepted,
        "tokens_per_step": round(s.tokens_per_step, 4),
        "tokens_per_s": round(s.tokens_per_s, 2),
        "mean_draft_length": round(s.mean_draft_length, 3),
        # lookup drafts by where they were copied from: context, session, persisted, corpus
        "origin_drafted": dict(s.origin_drafted),
        "origin_accepted": dict(s.origin_accepted),
        # of those, tokens taken free inside model drafts from earlier replies followed
        "spliced": s.spliced,
        "spliced_accepted": s.spliced_accepted,
        "draft_max": draft_max,
        "drafters": list(drafters),
        "policy": s.policy_note,
        "finish_reason": result.finish_reason,
        "prompt_tokens_reused": s.prompt_reused,
        "queue_s": round(queue_s, 4),
        "prompt_s": round(s.prompt_s, 4),
        "generate_s": round(s.generate_s, 4),
        # The share of generate_s outside llama.cpp's decodes: specllama's own cost.
        "overhead_share": round(s.overhead_share, 4),
    }


Piece = Callable[[int], bytes]


def logprobs(kind: str, result: GenerationResult, piece: Piece) -> dict[str, Any] | None:
    """The target's log-probabilities of the output in OpenAI's shape: chat's `content`
    list, or the legacy completions' parallel lists; None when they were not asked for."""
    if result.logprobs is None:
        return None
    if kind == "chat":
        def entry(token: int, lp: float) -> dict[str, Any]:
            raw = piece(token)
            return {"token": raw.decode("utf-8", "replace"), "logprob": lp, "bytes": list(raw)}

        return {"content": [{**entry(t.token, t.logprob),
                             "top_logprobs": [entry(i, lp) for i, lp in t.top]}
                            for t in result.logprobs], "refusal": None}
    texts = [piece(t.token).decode("utf-8", "replace") for t in result.logprobs]
    offsets = [sum(map(len, texts[:i])) for i in range(len(texts))]
    return {
        "tokens": texts,
        "token_logprobs": [t.logprob for t in result.logprobs],
        "top_logprobs": [{piece(i).decode("utf-8", "replace"): lp for i, lp in t.top}
                         for t in result.logprobs],
        "text_offset": offsets,
    }


def completion(
    work: Work, rid: str, model: str, result: GenerationResult, extra: dict[str, Any],
    piece: Piece,
) -> dict[str, Any]:
    """The non-streaming answer."""
    finish = FINISH_REASONS[result.finish_reason]
    lps = logprobs(work.kind, result, piece)
    if work.kind == "chat":
        calls = parse_calls(result.text, finish == "length") if work.tools else None
        message: dict[str, Any] = {"role": "assistant", "content": result.text}
        if calls:
            message = {"role": "assistant", "content": None, "tool_calls": calls}
            finish = "tool_calls" if finish == "stop" else finish
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": finish,
            "logprobs": lps,
        }
    else:
        choice = {"index": 0, "text": result.text, "finish_reason": finish, "logprobs": lps}
    return {
        "id": rid,
        "object": "chat.completion" if work.kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(result),
        EXTRA_KEY: extra,
    }


class Chunks:
    """The streamed answer, one chunk body at a time."""

    def __init__(self, work: Work, rid: str, model: str, include_usage: bool) -> None:
        self.kind = work.kind
        self.rid = rid
        self.model = model
        self.include_usage = include_usage
        self.created = int(time.time())
        # With tools, text that may begin a call is held back until it is told apart.
        self._undecided = work.tools is not None
        self._held = ""

    def _chunk(self, choices: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.rid,
            "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = None  # as OpenAI: null on every chunk but the last
        body.update(more)
        return body

    def _choice(self, text: str | None, finish: str | None, role: bool = False,
                lps: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": lps}
        return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": lps}

    def start(self) -> dict[str, Any] | None:
        """Chat streams open with the assistant's role and no text."""
        return self._chunk([self._choice("", None, role=True)]) if self.kind == "chat" else None

    def text(self, text: str) -> dict[str, Any] | None:
        """The chunk for new text; None while it is held back."""
        if self._undecided:
            self._held += text
            if OPEN.startswith(self._held) or self._held.startswith(OPEN.strip()):
                return None  # a call (sent whole at the end) or not yet known
            text, self._held, self._undecided = self._held, "", False
        return self._chunk([self._choice(text, None)])

    def end(self, result: GenerationResult, extra: dict[str, Any],
            piece: Piece) -> list[dict[str, Any]]:
        """The last chunk; the log-probabilities of the whole output, if asked for, come
        with it (a stop string can still cut tokens whose text was held back)."""
        finish = FINISH_REASONS[result.finish_reason]
        lps = logprobs(self.kind, result, piece)
        first: list[dict[str, Any]] = []
        calls = parse_calls(self._held, finish == "length") if self._held else None
        if calls:
            finish = "tool_calls" if finish == "stop" else finish
            first.append(self._chunk([{"index": 0, "finish_reason": None, "logprobs": None,
                                       "delta": {"tool_calls": [{"index": i, **c}
                                                                for i, c in enumerate(calls)]}}]))
        elif self._held:  # it looked like a call and was not (cut by max_tokens)
            first.append(self._chunk([self._choice(self._held, None)]))
        last = [*first,
                self._chunk([self._choice(None, finish, lps=lps)], **{EXTRA_KEY: extra})]
        if self.include_usage:
            last.append(self._chunk([], usage=usage(result), **{EXTRA_KEY: extra}))
        return last
