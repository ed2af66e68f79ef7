"""OpenAI's Chat Completions and (legacy) Completions: the request as the engine serves
it, answers and stream chunks in OpenAI's shapes.

Reasoning goes in `reasoning_content` (as llama-server and DeepSeek send it), never in
`content`; standard clients ignore the field, the `openai` client keeps it
(`message.model_extra["reasoning_content"]`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from ... import GenerationResult
from ..answer import Calls, Piece, ReasoningDelta, TextDelta, Whole
from ..prompts import Work
from ..schema import APIError, ChatRequest, CompletionRequest, parse
from .base import SSE, Body, Reply, Wanted, Writer, dumps, reasoning_tokens
from .figures import EXTRA_KEY

Q = TypeVar("Q", ChatRequest, CompletionRequest)


def usage(result: GenerationResult, reasoning: int = 0) -> Body:
    """OpenAI's usage, its details always there as OpenAI sends them (zeros where
    nothing counts). A prediction's tokens as OpenAI counts them: those drafted from it
    that the target accepted (part of completion_tokens) and those it turned down,
    drafted past a rejection included (not part of it: OpenAI bills them, nothing here
    costs money)."""
    completion = len(result.tokens)
    s = result.stats
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.prompt_tokens + completion,
        # OpenAI's name for prompt tokens served from a cache: here, the KV caches.
        "prompt_tokens_details": {"cached_tokens": s.prompt_reused, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": reasoning, "audio_tokens": 0,
            "accepted_prediction_tokens": s.origin_accepted.get("prediction", 0),
            "rejected_prediction_tokens": s.origin_drafted.get("prediction", 0)
            - s.origin_accepted.get("prediction", 0)},
    }


def logprobs(kind: str, result: GenerationResult, reply: Reply) -> Body | None:
    """The target's log-probabilities of the output in OpenAI's shape: chat's `content`
    list, or the legacy completions' parallel lists; None when they were not asked for."""
    if result.logprobs is None:
        return None
    piece = reply.piece
    if kind == "chat":
        def entry(token: int, lp: float) -> Body:
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


def _calls(whole_calls: tuple[Any, ...]) -> list[Body]:
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in whole_calls]


class OpenAI(Generic[Q]):
    """Chat Completions (`ChatRequest`) or Completions (`CompletionRequest`)."""

    def __init__(self, kind: type[Q]) -> None:
        self.kind: type[Q] = kind

    def parse(self, body: bytes) -> Q:
        parsed: Q = parse(body, self.kind)
        return parsed

    def chat(self, request: Q) -> ChatRequest | CompletionRequest:
        return request

    def wants(self, request: Q) -> Wanted:
        return "text" if request.stream else "end"

    def work(self, request: Q, work: Work) -> Work:
        return work

    def new_id(self, work: Any) -> str:
        return ("chatcmpl-" if work.kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]

    def error(self, exc: APIError) -> Body:
        return exc.body()

    def complete(self, request: Q, reply: Reply, whole: Whole, result: GenerationResult,
                 extra: Body) -> Body:
        lps = logprobs(reply.work.kind, result, reply)
        if reply.work.kind == "chat":
            message: Body = {"role": "assistant", "content": whole.text}
            if whole.reasoning is not None:
                message["reasoning_content"] = whole.reasoning
            if whole.calls:
                message["tool_calls"] = _calls(whole.calls)
            choice: Body = {"index": 0, "message": message, "finish_reason": whole.finish,
                            "logprobs": lps}
        else:
            choice = {"index": 0, "text": result.text, "finish_reason": whole.finish,
                      "logprobs": lps}
        return {
            "id": reply.rid,
            "object": "chat.completion" if reply.work.kind == "chat" else "text_completion",
            "created": reply.created,
            "model": reply.model,
            "choices": [choice],
            "usage": usage(result, reasoning_tokens(reply.work, whole, result, reply)),
            EXTRA_KEY: extra,
        }

    def writer(self, request: Q, reply: Reply) -> Writer:
        return Chunks(reply, request.include_usage)


class Chunks:
    """The streamed answer, one chunk at a time, ending with `[DONE]`."""

    def __init__(self, reply: Reply, include_usage: bool) -> None:
        self.reply = reply
        self.chat = reply.work.kind == "chat"
        self.include_usage = include_usage

    def _chunk(self, choices: list[Body], **more: Any) -> SSE:
        body: Body = {
            "id": self.reply.rid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.reply.created,
            "model": self.reply.model,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = None  # as OpenAI: null on every chunk but the last
        body.update(more)
        return {"data": dumps(body)}

    def _delta(self, delta: Body, finish: str | None = None,
               lps: Body | None = None) -> Body:
        if self.chat:
            return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": lps}
        return {"index": 0, "text": delta.get("content") or "", "finish_reason": finish,
                "logprobs": lps}

    def start(self) -> list[SSE]:
        """Chat streams open with the assistant's role and no text."""
        return [self._chunk([self._delta({"role": "assistant", "content": ""})])] \
            if self.chat else []

    def pieces(self, pieces: list[Piece], items: Sequence[object] = ()) -> list[SSE]:
        out: list[SSE] = []
        text, reasoning = "", ""
        for p in pieces:  # pieces that came together go out as one chunk of each kind
            if isinstance(p, TextDelta):
                text += p.text
            elif isinstance(p, ReasoningDelta):
                reasoning += p.text
            elif isinstance(p, Calls):
                out += self._emit(reasoning, text)
                text, reasoning = "", ""
                out.append(self._chunk([self._delta({"tool_calls": [
                    {"index": i, **c} for i, c in enumerate(_calls(p.calls))]})]))
        return out + self._emit(reasoning, text)

    def _emit(self, reasoning: str, text: str) -> list[SSE]:
        out = []
        if reasoning and self.chat:
            out.append(self._chunk([self._delta({"reasoning_content": reasoning})]))
        elif reasoning:  # the legacy API has no field for it: the text as generated
            text = reasoning + text
        if text:
            out.append(self._chunk([self._delta({"content": text})]))
        return out

    def end(self, tail: list[Piece], whole: Whole, result: GenerationResult,
            extra: Body) -> list[SSE]:
        """The held-back pieces, then the last chunk with the log-probabilities of the
        whole output, if asked for (a stop string can still cut held-back text)."""
        lps = logprobs(self.reply.work.kind, result, self.reply)
        out = [*self.pieces(tail),
               self._chunk([self._delta({}, whole.finish, lps)], **{EXTRA_KEY: extra})]
        if self.include_usage:
            reasoning = reasoning_tokens(self.reply.work, whole, result, self.reply)
            out.append(self._chunk([], usage=usage(result, reasoning), **{EXTRA_KEY: extra}))
        return [*out, {"data": "[DONE]"}]

    def error(self, exc: APIError) -> list[SSE]:
        return [{"data": dumps(exc.body())}, {"data": "[DONE]"}]
