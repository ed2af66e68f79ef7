"""Request bodies of the OpenAI API (the fields specllama honours), and how they are read.

Status codes: 400 for a body that is not UTF-8 JSON (or not text: a lone surrogate;
or past what Python reads: nested too deeply, a number too long) or a value out of its
range (as OpenAI answers), 422 for JSON of the wrong shape (a missing field, a wrong type).

Arrays have caps (`_Request.limits`, OpenAI's where it has one), checked on the decoded
JSON before anything walks their items: a 4 MiB body of a million messages is refused in
the time json.loads takes, not after a second of validation on the event loop.
"""

from __future__ import annotations

import gc
import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from .apierror import APIError
from .surrogates import SURROGATE_ESCAPE, NestedTooDeep, lone_surrogate

# Pydantic error types that mean "a value out of range" rather than "the wrong shape".
_RANGE_ERRORS = {
    "greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_short", "too_long",
}

MAX_MESSAGES = 2048  # OpenAI's
MAX_STOP = 4  # OpenAI's
MAX_TOOLS = 128  # OpenAI's
# Choices of one request (n, llama-server's n_cmpl) run one after another on its slot,
# holding it n times as long: this bounds how long one request keeps the others waiting.
MAX_CHOICES = 8
# Content parts and earlier tool calls, over all the messages together.
MAX_PARTS = 4096


class _Body(BaseModel):
    # Clients send fields we do not use (user, logprobs: null, ...): ignored, as OpenAI does.
    # Strict: `"temperature": true`, `"max_tokens": "3"` or `"stream": 0` is a 400, not read
    # as 1.0, 3 or false (schemathesis found them taken); an integer is still a number.
    model_config = ConfigDict(extra="ignore", strict=True)


def _null_is(default: Any) -> BeforeValidator:
    """JSON null read as the field's default, as OpenAI reads it (`"stream": null`)."""
    return BeforeValidator(lambda value: default if value is None else value)


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
    """OpenAI's `response_format`: free text, any JSON object, or JSON following a schema;
    and llama-server's `schema` beside the type (`{"type": "json_object", "schema": ...}`)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")


# Fields of OpenAI's API that change what a model returns and that specllama does not do:
# each gets a 400 naming it unless it holds its no-op value, rather than free text that
# looks like an answer. (Fields that change nothing for one local model, `user`,
# `metadata`, `store`, ..., are ignored as OpenAI's own servers ignore them.)
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "logit_bias": (None, {}),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "audio": (None,),
    "modalities": (None, ["text"]),
    # llama-server's samplers that specllama does not have (docs/apis.md): each off at
    # its no-op value. A sampler's other fields (dry_base, xtc_threshold, mirostat_tau,
    # dynatemp_exponent, ...) change nothing while it is off, as in
    # llama.cpp, so they pass; switched on, the 400 names the switch.
    "mirostat": (None, 0), "typical_p": (None, 1), "tfs_z": (None, 1),
    "dry_multiplier": (None, 0), "xtc_probability": (None, 0),
    "dynatemp_range": (None, 0), "top_n_sigma": (None, -1, 0),
    "min_keep": (None, 0), "samplers": (None,),  # specllama's order is fixed (docs/apis.md)
    "n_probs": (None, 0), "post_sampling_probs": (None, False),  # here: logprobs
    "n_indent": (None, 0), "t_max_predict_ms": (None, 0),
}


class Prediction(_Body):
    """OpenAI's Predicted Outputs: text the answer is expected to resemble (the file being
    edited), drafted from wherever the answer is in step with it (engine/drafting/
    prediction.py); the answer is the model's own all the same. `type` is checked first
    (`_check_prediction`): anything but "content" is a 400 naming it."""

    type: Literal["content"]
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content


class _Request(_Body):
    model: str
    stream: Annotated[bool, _null_is(False)] = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)  # llama.cpp's extension; 0 = off
    min_p: float | None = Field(None, ge=0, le=1)  # llama.cpp's extension
    max_tokens: int | None = Field(None, ge=1)
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    seed: int | None = Field(None, ge=0)
    n: Annotated[int, _null_is(1)] = Field(1, ge=1, le=MAX_CHOICES)  # parse: max_choices
    n_cmpl: Annotated[int | None, Field(ge=1, le=MAX_CHOICES)] = None  # llama-server's n
    response_format: ResponseFormat | None = None
    # llama-server's: a GBNF grammar, a JSON schema ({}: any object), the end-of-generation
    # tokens unable to end the answer, and its name of max_tokens (-1: as many as fit).
    # Plain defaults: mypy reads a `Field(None, ...)` as required of the APIs that build one.
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    ignore_eos: Annotated[bool, _null_is(False)] = False
    n_predict: int | None = None
    # Penalties on what the text holds already (engine/penalties.py), exact under
    # speculation: OpenAI's two and llama.cpp's repeat penalty (another server's name
    # for it: repetition_penalty) over its window (-1: the whole text, 0: none).
    presence_penalty: Annotated[float | None, Field(ge=-2, le=2)] = None
    frequency_penalty: Annotated[float | None, Field(ge=-2, le=2)] = None
    repeat_penalty: Annotated[float | None, Field(gt=0)] = None
    repetition_penalty: Annotated[float | None, Field(gt=0)] = None
    repeat_last_n: Annotated[int | None, Field(ge=-1)] = None
    prediction: Prediction | None = None
    # The most items each array field may hold (see `_check_sizes`).
    limits: ClassVar[dict[str, int]] = {"stop": MAX_STOP}
    # The fields of UNSUPPORTED this API honours (the others get their 400).
    honours: ClassVar[frozenset[str]] = frozenset()
    max_choices: ClassVar[int] = MAX_CHOICES

    @property
    def choices(self) -> int:
        """Completions of the prompt asked for: n_cmpl, else n (its alias in llama-server)."""
        return self.n if self.n_cmpl is None else self.n_cmpl

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
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: Annotated[bool, _null_is(False)] = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: Annotated[bool, _null_is(True)] = True
    # OpenAI's reasoning effort; "none" turns thinking off where the template can (reasoning.py)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    # Tokens of reasoning before its close is forced (Anthropic's thinking.budget_tokens;
    # as llama-server's --reasoning-budget, for one request): reasoning.py's markers.
    reasoning_budget: Annotated[int | None, Field(ge=0)] = None
    limits: ClassVar[dict[str, int]] = {**_Request.limits, "messages": MAX_MESSAGES,
                                        "tools": MAX_TOOLS}

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
    # Fill in the middle (server/fim.py): the text after the completion, then llama-server's
    # stops for editors: a line less indented than n_indent, a newline past the time.
    suffix: str | None = None
    n_indent: int = Field(0, ge=0)
    t_max_predict_ms: int = Field(0, ge=0)
    limits: ClassVar[dict[str, int]] = {**_Request.limits, "prompt": 1}
    honours: ClassVar[frozenset[str]] = frozenset({"suffix", "n_indent", "t_max_predict_ms"})

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
        data = _loads(text)
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
    if isinstance(data, dict):  # the cheap checks first: none walks an array's items
        _check_unsupported(data, kind.honours)
        _check_prediction(data.get("prediction"))
        if issubclass(kind, _Request):  # (Responses' and Messages' models have no n)
            _check_choices(data.get("n"), data.get("n_cmpl"), kind.max_choices)
        _check_sizes(data, kind)
    if SURROGATE_ESCAPE.search(text):
        try:
            path = lone_surrogate(data, kind.model_fields)
        except NestedTooDeep as exc:
            raise APIError(400, f"{exc.name or 'the request body'}: JSON nested too deeply to "
                           "read", param=exc.name) from None
        if path is not None:
            raise APIError(
                400,
                f"{'.'.join(path) + ':' if path else 'the request body'} holds a lone "
                "UTF-16 surrogate (an escape \\ud800-\\udfff without its pair), which is not text",
                param=path[0] if path else None,
            )
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = [str(part) for part in first["loc"]]
        where = ".".join(loc)
        status = 400 if first["type"] in _RANGE_ERRORS else 422
        message = f"{where}: {first['msg']}" if where else first["msg"]
        raise APIError(status, message, param=loc[0] if loc else None) from None


def _loads(text: str) -> Any:
    """json.loads with the cyclic GC paused: a body of a million small lists otherwise
    runs it over and over (0.4 s for 2 MiB of "[]," here, 0.05 s paused); JSON builds
    no cycles, so there is nothing for it to find."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return json.loads(text)
    finally:
        if enabled:
            gc.enable()


def json_equal(a: Any, b: Any) -> bool:
    """Equal as JSON values (and JSON Schema's enum) compare them: 0.0 is 0, false is not
    0 (Python's True == 1)."""
    return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)


def _check_unsupported(data: dict[str, Any], honoured: frozenset[str]) -> None:
    # Comparing with None, {} or a one-item list is O(1) whatever the client sent.
    for name, no_op in UNSUPPORTED.items():
        if name in data and name not in honoured and not any(
                json_equal(data[name], v) for v in no_op):
            raise APIError(400, f"{name} is not supported by this server (specllama "
                           "serve); leave it out", param=name, code="unsupported_parameter")


def _check_choices(n: Any, n_cmpl: Any, most: int) -> None:
    """Choices out of range (other types are pydantic's to refuse)."""
    if type(n_cmpl) is int and not 1 <= n_cmpl <= most:
        # llama-server's words: llama.vscode recognises them and names its setting to change
        raise APIError(400, f"Field 'n_cmpl': Value must be between 1 <= value <= {most}, "
                       f"but got {n_cmpl}", param="n_cmpl")
    if type(n) is int and n > most:
        raise APIError(400, f"n: {n} choices asked, at most {most} here", param="n")


def _check_prediction(prediction: Any) -> None:
    """OpenAI's one kind of prediction: its text ("content"). Another is a 400 naming
    prediction.type, not a 422 about a literal."""
    kind = prediction.get("type") if isinstance(prediction, dict) else None
    if isinstance(prediction, dict) and kind != "content":
        raise APIError(400, f"prediction.type must be \"content\" (text the answer is "
                       f"expected to resemble), got {json.dumps(kind)}",
                       param="prediction.type", code="unsupported_parameter")


def _check_sizes(data: dict[str, Any], kind: type[_Request]) -> None:
    """An array past its cap, by name, in OpenAI's words; O(number of messages)."""
    for name, limit in kind.limits.items():
        value = data.get(name)
        if isinstance(value, list) and len(value) > limit:
            raise APIError(400, f"Invalid '{name}': array too long. Expected an array with "
                           f"maximum length {limit}, but got an array with length "
                           f"{len(value)} instead.", param=name, code="array_above_max_length")
    messages = data.get("messages") if "messages" in kind.limits else None
    if not isinstance(messages, list):
        return
    parts = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        for field in ("content", "tool_calls"):
            items = message.get(field)
            parts += len(items) if isinstance(items, list) else 0
            if parts > MAX_PARTS:
                raise APIError(400, f"Invalid 'messages[{i}].{field}': the messages hold more "
                               f"than {MAX_PARTS} content parts and tool calls in all",
                               param="messages", code="array_above_max_length")
