"""llama-server's POST /infill, for code editors' plugins (llama.vim, llama.vscode): fill
in the middle between the code before and after the cursor (server/fim.py builds the
prompt), answered in the shape of llama-server's /completion as far as they read it.

Not streamed: one JSON body (`content`, `stop_type`, `timings`, `tokens_cached`,
`truncated`, ...). Streamed: `data: {"content": ..., "stop": false}` events, the last with
`stop: true` and the figures, no `[DONE]`, as llama-server streams /completion.
`response_fields` picks the answer's fields, "timings/prompt_n" flattened to a key of
that name, as llama-server does (llama.vim reads them so). `n_cmpl` above 1 (llama.vscode
sends 3): a JSON array of such bodies, each with its `index`, as llama-server answers it;
streamed, each choice's events in turn, carrying its `index`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ... import GenerationResult, TargetToken, TokensAccepted
from ...engine.llama import Vocabulary
from ...engine.loop.linestops import Deadline, Indent
from ..answer import Piece, TextDelta, Whole
from ..apierror import APIError
from ..fim import check
from ..prompts import Work
from ..schema import CompletionRequest, parse
from .base import SSE, Answered, Body, Reply, Wanted, Writer, dumps
from .figures import EXTRA_KEY
from .infill_schema import InfillRequest, sampled_by


class InfillDialect:
    """POST /infill as one of app.py's APIs (apis/base.Dialect)."""

    def __init__(self, vocab: Vocabulary, model_id: str) -> None:
        """vocab: the target's (the prompt shown back, its FIM tokens); model_id: the
        name of the model served, for a request that names none."""
        self.vocab, self.model_id = vocab, model_id

    def parse(self, body: bytes) -> InfillRequest:
        request: InfillRequest = parse(body, InfillRequest)
        request.samplers_run()  # an unknown sampler's 400, before the queue
        check(self.vocab, "input_prefix")
        return request

    def chat(self, request: InfillRequest) -> CompletionRequest:
        return request if request.model else request.model_copy(update={"model": self.model_id})

    def wants(self, request: InfillRequest) -> Wanted:
        return "text" if request.stream else "end"

    def work(self, request: InfillRequest, work: Work) -> Work:
        if request.samplers is None:
            return work
        return replace(work, sampling=sampled_by(request.samplers_run(), work.sampling))

    def new_id(self, work: Work) -> str:
        return "infill-" + uuid.uuid4().hex[:24]

    def error(self, exc: APIError) -> Body:
        return exc.body()

    def complete(self, request: InfillRequest, reply: Reply, whole: Whole,
                 result: GenerationResult, extra: Body) -> Body:
        return self.final(request, reply, result, extra, streamed=False)

    def complete_all(self, request: InfillRequest, reply: Reply,
                     answers: Sequence[Answered]) -> Body | list[Body]:
        """llama-server's n_cmpl: one body, or a list of them, each with its `index`."""
        bodies = [self.final(request, reply, a.result, a.extra, streamed=False, index=i)
                  for i, a in enumerate(answers)]
        return bodies[0] if len(bodies) == 1 else bodies

    def writer(self, request: InfillRequest, reply: Reply) -> Writer:
        return Events(self, request, reply)

    def final(self, request: InfillRequest, reply: Reply, result: GenerationResult,
              extra: Body, *, streamed: bool, index: int = 0) -> Body:
        """A choice's last body (streamed: its text went out before, as llama-server's)."""
        n = len(result.tokens)
        body: Body = {
            "index": index,
            "content": "" if streamed else result.text,
            "tokens": list(result.tokens) if request.return_tokens and not streamed else [],
            "stop": True,
            "model": reply.model,
            "tokens_predicted": n,
            "tokens_evaluated": result.prompt_tokens,
            "generation_settings": settings(request, reply.work),
            "prompt": self.vocab.render(reply.work.tokens),
            "has_new_line": "\n" in result.text,
            "truncated": result.finish_reason == "context",
            "stop_type": stop_type(result),
            "stopping_word": result.stop_string or "",
            # What the cache holds once done: the prompt and the answer but its newest token.
            "tokens_cached": max(0, result.prompt_tokens + n - 1),
            "timings": timings(result),
            EXTRA_KEY: extra,
        }
        return body if request.response_fields is None else picked(body,
                                                                   request.response_fields)


class Events:
    """The streamed answer: the text as it comes, then the last body; several choices one
    after another, each event with its choice's `index`."""

    def __init__(self, dialect: InfillDialect, request: InfillRequest, reply: Reply) -> None:
        self.dialect, self.request, self.reply = dialect, request, reply
        self.predicted = self.index = 0

    def start(self) -> list[SSE]:
        return []

    def pieces(self, pieces: list[Piece], items: Sequence[object] = ()) -> list[SSE]:
        self.predicted += sum(len(i.tokens) if isinstance(i, TokensAccepted) else 1
                              for i in items if isinstance(i, TokensAccepted | TargetToken))
        text = "".join(p.text for p in pieces if isinstance(p, TextDelta))
        if not text:
            return []
        return [{"data": dumps({"index": self.index, "content": text, "tokens": [], "stop": False,
                                "id_slot": -1, "tokens_predicted": self.predicted,
                                "tokens_evaluated": len(self.reply.work.tokens)})}]

    def end(self, tail: list[Piece], whole: Whole, result: GenerationResult,
            extra: Body) -> list[SSE]:
        last = self.dialect.final(self.request, self.reply, result, extra, streamed=True,
                                  index=self.index)
        out = [*self.pieces(tail), {"data": dumps(last)}]
        self.predicted, self.index = 0, self.index + 1  # the next choice's
        return out

    def error(self, exc: APIError) -> list[SSE]:
        return [{"data": dumps(exc.body())}]


def stop_type(result: GenerationResult) -> str:
    """llama-server's: "eos", "word" (a stop string), "limit" (n_predict, the window,
    n_indent, t_max_predict_ms), "none" (cut short)."""
    if isinstance(result.stopped_by, Indent | Deadline):
        return "limit"
    return {"eos": "eos", "stop": "word", "length": "limit",
            "context": "limit"}.get(result.finish_reason, "none")


def timings(result: GenerationResult) -> Body:
    """llama-server's `timings`; `draft_n` and `draft_n_accepted` where anything drafted."""
    s = result.stats
    prompt_n, predicted_n = result.prompt_tokens - s.prompt_reused, len(result.tokens)
    prompt_ms, predicted_ms = s.prompt_s * 1e3, s.generate_s * 1e3
    out: Body = {
        "cache_n": s.prompt_reused,
        "prompt_n": prompt_n, "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n, "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
        "predicted_per_second": 1e3 * predicted_n / predicted_ms if predicted_ms > 0 else 0.0,
    }
    if s.drafted:
        out.update(draft_n=s.drafted, draft_n_accepted=s.accepted)
    return out


def settings(request: InfillRequest, work: Work) -> Body:
    """What the answer was generated with (llama-server's generation_settings, in part)."""
    s = work.sampling
    return {"n_predict": work.max_tokens, "temperature": s.temperature, "top_k": s.top_k,
            "top_p": s.top_p, "min_p": s.min_p, "seed": -1 if s.seed is None else s.seed,
            "samplers": list(request.samplers_run()), "stop": list(request.stops),
            "n_indent": request.n_indent, "t_max_predict_ms": request.t_max_predict_ms,
            "stream": request.stream}


def picked(body: Body, paths: list[str]) -> Body:
    """The fields `paths` name, "a/b" for b inside a, each under its path as a key; one
    missing is left out (llama-server's json_get_nested_values)."""
    out: Body = {}
    for path in paths:
        value: Any = body
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out
