"""Response bodies in OpenAI's shapes, plus specllama's figures under one extra key.

Standard clients ignore the extra key `speculative`; the `openai` client keeps it
(`completion.model_extra["speculative"]`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from .. import GenerationResult
from .prompts import Work

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
    result: GenerationResult, *, draft_max: int | str, draft_mode: str, queue_s: float
) -> dict[str, Any]:
    """What speculation did for this request."""
    s = result.stats
    return {
        "target_steps": s.target_steps,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "acceptance_rate": round(s.acceptance_rate, 4),
        "acceptance_by_position": [round(a, 4) for a in s.acceptance_by_position],
        "tokens_per_step": round(s.tokens_per_step, 4),
        "tokens_per_s": round(s.tokens_per_s, 2),
        "mean_draft_length": round(s.mean_draft_length, 3),
        "draft_max": draft_max,
        "draft_mode": draft_mode,
        "policy": s.policy_note,
        "finish_reason": result.finish_reason,
        "prompt_tokens_reused": s.prompt_reused,
        "queue_s": round(queue_s, 4),
        "prompt_s": round(s.prompt_s, 4),
        "generate_s": round(s.generate_s, 4),
        # The share of generate_s outside llama.cpp's decodes: specllama's own cost.
        "overhead_share": round(s.overhead_share, 4),
    }


def completion(
    work: Work, rid: str, model: str, result: GenerationResult, extra: dict[str, Any]
) -> dict[str, Any]:
    """The non-streaming answer."""
    finish = FINISH_REASONS[result.finish_reason]
    if work.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": result.text},
            "finish_reason": finish,
            "logprobs": None,
        }
    else:
        choice = {"index": 0, "text": result.text, "finish_reason": finish, "logprobs": None}
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

    def _choice(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}

    def start(self) -> dict[str, Any] | None:
        """Chat streams open with the assistant's role and no text."""
        return self._chunk([self._choice("", None, role=True)]) if self.kind == "chat" else None

    def text(self, text: str) -> dict[str, Any]:
        return self._chunk([self._choice(text, None)])

    def end(self, result: GenerationResult, extra: dict[str, Any]) -> list[dict[str, Any]]:
        finish = FINISH_REASONS[result.finish_reason]
        last = [self._chunk([self._choice(None, finish)], **{EXTRA_KEY: extra})]
        if self.include_usage:
            last.append(self._chunk([], usage=usage(result), **{EXTRA_KEY: extra}))
        return last
