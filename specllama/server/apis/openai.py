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
from ..apierror import APIError
from ..prompts import Work
from ..schema import ChatRequest, CompletionRequest, parse
from .base import SSE, Answered, Body, Reply, Wanted, Writer, dumps, reasoning_tokens
from .figures import EXTRA_KEY, summed

Q = TypeVar("Q", ChatRequest, CompletionRequest)


def usage(results: Sequence[GenerationResult], reasoning: int = 0) -> Body:
    """OpenAI's usage over the choices, the prompt counted once (as OpenAI counts n), its
    details always there as OpenAI sends them (zeros where nothing counts). A
    prediction's tokens as OpenAI counts them: those drafted from it that the target
    accepted (part of completion_tokens) and those it turned down, drafted past a
    rejection included (not part of it: OpenAI bills them, nothing here costs money)."""
    first = results[0]
    completion = sum(len(r.tokens) for r in results)
    accepted = sum(r.stats.origin_accepted.get("prediction", 0) for r in results)
    drafted = sum(r.stats.origin_drafted.get("prediction", 0) for r in results)
    return {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.prompt_tokens + completion,
        # OpenAI's name for prompt tokens served from a cache: here, the KV caches (the
        # first choice's: the others find the prompt there).
        "prompt_tokens_details": {"cached_tokens": first.stats.prompt_reused,
                                  "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": reasoning, "audio_tokens": 0,
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": drafted - accepted},
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


def _choice(reply: Reply, index: int, answered: Answered) -> Body:
    whole, result = answered.whole, answered.result
    lps = logprobs(reply.work.kind, result, reply)
    if reply.work.kind != "chat":
        return {"index": index, "text": result.text, "finish_reason": whole.finish,
                "logprobs": lps}
    message: Body = {"role": "assistant", "content": whole.text}
    if whole.reasoning is not None:
        message["reasoning_content"] = whole.reasoning
    if whole.calls:
        message["tool_calls"] = _calls(whole.calls)
    return {"index": index, "message": message, "finish_reason": whole.finish, "logprobs": lps}


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
        return self.complete_all(request, reply, [Answered(whole, result, extra)])

    def complete_all(self, request: Q, reply: Reply, answers: Sequence[Answered]) -> Body:
        """n choices, `index` 0..n-1; with more than one, each has its own figures and
        the answer's are their sum (figures.summed)."""
        choices = [_choice(reply, i, a) for i, a in enumerate(answers)]
        results = [a.result for a in answers]
        extra = answers[0].extra
        if len(answers) > 1:
            for choice, a in zip(choices, answers):
                choice[EXTRA_KEY] = a.extra
            extra = summed(results, extra)
        reasoning = sum(reasoning_tokens(reply.work, a.whole, a.result, reply) for a in answers)
        return {
            "id": reply.rid,
            "object": "chat.completion" if reply.work.kind == "chat" else "text_completion",
            "created": reply.created,
            "model": reply.model,
            "choices": choices,
            "usage": usage(results, reasoning),
            EXTRA_KEY: extra,
        }

    def writer(self, request: Q, reply: Reply) -> Writer:
        return Chunks(reply, request.include_usage, request.choices)


class Chunks:
    """The streamed answer, one chunk at a time, ending with `[DONE]`; several choices
    one after another, each chunk with its choice's `index` (clients reassemble by it)."""

    def __init__(self, reply: Reply, include_usage: bool, choices: int = 1) -> None:
        self.reply = reply
        self.chat = reply.work.kind == "chat"
        self.include_usage = include_usage
        self.choices, self.index = choices, 0
        self.ended: list[Answered] = []

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
            return {"index": self.index, "delta": delta, "finish_reason": finish,
                    "logprobs": lps}
        return {"index": self.index, "text": delta.get("content") or "",
                "finish_reason": finish, "logprobs": lps}

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
        """The held-back pieces, then the choice's last chunk with the log-probabilities
        of its whole output, if asked for (a stop string can still cut held-back text);
        after the last choice's, the usage of them all and `[DONE]`."""
        lps = logprobs(self.reply.work.kind, result, self.reply)
        out = [*self.pieces(tail),
               self._chunk([self._delta({}, whole.finish, lps)], **{EXTRA_KEY: extra})]
        self.ended.append(Answered(whole, result, extra))
        if len(self.ended) < self.choices:  # the next choice opens
            self.index += 1
            return out + self.start()
        if self.include_usage:
            results = [a.result for a in self.ended]
            reasoning = sum(reasoning_tokens(self.reply.work, a.whole, a.result, self.reply)
                            for a in self.ended)
            figures = extra if len(results) == 1 else summed(results, extra)
            out.append(self._chunk([], usage=usage(results, reasoning), **{EXTRA_KEY: figures}))
        return [*out, {"data": "[DONE]"}]

    def error(self, exc: APIError) -> list[SSE]:
        return [{"data": dumps(exc.body())}, {"data": "[DONE]"}]
