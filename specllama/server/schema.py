"""Request bodies of the OpenAI API (the fields specllama honours) and OpenAI-shaped errors.

Status codes: 400 for a body that is not UTF-8 JSON (or not text: a lone surrogate;
or past what Python reads: nested too deeply, a number too long) or a value out of its
range (as OpenAI answers), 422 for JSON of the wrong shape (a missing field, a wrong type).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# Pydantic error types that mean "a value out of range" rather than "the wrong shape".
_RANGE_ERRORS = {
    "greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_short", "too_long",
}
# A JSON escape of a UTF-16 surrogate: the only way a lone one gets into a decoded body.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class APIError(Exception):
    """An error answered as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class _Body(BaseModel):
    # Clients send fields we do not use (user, logprobs: null, ...): ignored, as OpenAI does.
    model_config = ConfigDict(extra="ignore")


class TextPart(_Body):
    type: Literal["text"]
    text: str


class FunctionDef(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none: no arguments
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: FunctionName


class CalledFunction(_Body):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Body):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer: to which call

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(_Body):
    include_usage: bool = False


class JSONSchemaFormat(_Body):
    name: str = "response"
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """OpenAI's `response_format`: free text, any JSON object, or JSON following a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


# Fields of OpenAI's API that change what a model returns and that specllama does not do:
# each gets a 400 naming it unless it holds its no-op value, rather than free text that
# looks like an answer. (Fields that change nothing for one local model, `user`,
# `metadata`, `store`, ..., are ignored as OpenAI's own servers ignore them.)
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
}


class _Request(_Body):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)  # llama.cpp's extension; 0 = off
    min_p: float | None = Field(None, ge=0, le=1)  # llama.cpp's extension
    max_tokens: int | None = Field(None, ge=1)
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    seed: int | None = Field(None, ge=0)
    n: int = Field(1, ge=1, le=1)  # one choice per request
    response_format: ResponseFormat | None = None

    @property
    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens


class ChatRequest(_Request):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    @property
    def n_logprobs(self) -> int | None:
        """None: no log-probabilities; n: the chosen token's and the n likeliest."""
        if not self.logprobs:
            if self.top_logprobs:
                raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
            return None
        return self.top_logprobs or 0

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Request):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]
    logprobs: int | None = Field(None, ge=0, le=5)  # the legacy API: how many likeliest

    @property
    def n_logprobs(self) -> int | None:
        return self.logprobs

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


def parse(body: bytes, kind: type[_Request]) -> Any:
    """The request body as `kind`, or an APIError saying what is wrong with it."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(400, f"the request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise APIError(
            400,
            f"the request body is not valid JSON: {exc.msg} (line {exc.lineno}, "
            f"column {exc.colno})",
        ) from None
    except RecursionError:
        raise APIError(400, "the request body is JSON nested too deeply to read") from None
    except ValueError:  # Python's limit on the digits of an integer (sys.int_info)
        raise APIError(400, "the request body holds a number with too many digits") from None
    if _SURROGATE_ESCAPE.search(text):
        path = _lone_surrogate(data)
        if path is not None:
            raise APIError(
                400,
                f"{'.'.join(path) + ':' if path else 'the request body'} holds a lone "
                "UTF-16 surrogate (an escape \\ud800-\\udfff without its pair), which is not text",
                param=path[0] if path else None,
            )
    if isinstance(data, dict):
        for name, no_op in UNSUPPORTED.items():
            if name in data and not any(data[name] == v and type(data[name]) is type(v)
                                        for v in no_op):
                raise APIError(400, f"{name} is not supported by this server (specllama "
                               "serve); leave it out", param=name, code="unsupported_parameter")
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = [str(part) for part in first["loc"]]
        where = ".".join(loc)
        status = 400 if first["type"] in _RANGE_ERRORS else 422
        message = f"{where}: {first['msg']}" if where else first["msg"]
        raise APIError(status, message, param=loc[0] if loc else None) from None


def _lone_surrogate(data: Any) -> list[str] | None:
    """The path to the first string (or key) holding an unpaired surrogate, or None.
    A loop, not recursion: the body may be nested as deep as json.loads allows."""
    todo: list[tuple[list[str], Any]] = [([], data)]
    while todo:
        path, value = todo.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return path
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):
                if _SURROGATE.search(key):
                    return path
                todo.append(([*path, key], item))
        elif isinstance(value, list):
            todo += [([*path, str(i)], item) for i, item in reversed(list(enumerate(value)))]
    return None
