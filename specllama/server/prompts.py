"""A validated request -> the work for the decoder: prompt tokens and settings.

Runs on the event loop's thread pool, on the target's vocabulary alone (the models
themselves are in the engine process).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .. import (
    ConstraintError,
    ConstraintSpec,
    Drafters,
    InvalidParameterError,
    Penalties,
    SamplingParams,
)
from ..engine.llama import Vocabulary
from ..engine.loop.budget import ReasoningBudget
from ..engine.loop.textstream import Stop
from . import fim
from .apierror import APIError
from .reasoning import (
    Format,
    Markers,
    constrain_answer,
    markers,
    thinking_off,
    variables,
    with_tokens,
)
from .schema import ChatRequest, CompletionRequest, ResponseFormat
from .tools import (
    REPEATED_CALL,
    ToolUse,
    generic_messages,
    native_messages,
    template_has_tools,
    tool_use,
)

# Used when the target has no chat template, as `specllama chat` does.
PLAIN_STOP = ("\nUser:",)


@dataclass(frozen=True)
class Defaults:
    """What a request gets for the fields it leaves out: the server's settings."""

    sampling: SamplingParams
    max_tokens: int
    # `serve --json-schema/--grammar/--regex`: for requests without a response_format
    constraint: ConstraintSpec | None = None
    # `serve --reasoning-format`: "auto" splits the reasoning off where the template marks
    # it (reasoning.py), "none" leaves it in the answer text
    reasoning_format: Format = "auto"


@dataclass(frozen=True)
class Work:
    kind: Literal["chat", "completion"]
    tokens: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[Stop, ...]  # strings, and rules (a call made twice, n_indent, ...)
    constraint: ConstraintSpec | None = None
    logprobs: int | None = None  # None: none; n: the chosen token's and the n likeliest
    # A chat's (role, content) turns: a draft of another family renders them in its own
    # chat template, in the engine process (which has its vocabulary).
    turns: tuple[tuple[str, str], ...] = ()
    tools: ToolUse | None = None  # the answer may be tool calls
    reasoning: Markers | None = None  # the template's reasoning markers, when split out
    # This request's own draft settings (POST /v1/rounds' fields), each already checked
    # by the settings table (engine/settings.py); None: the server's.
    draft_max: int | str | None = None
    drafters: Drafters | None = None
    # llama-server's ignore_eos: the end-of-generation tokens cannot end the answer (the
    # target's law without them: engine/decoder.py, `_masks`).
    ignore_eos: bool = False
    # The reasoning's close forced once it has run this budget (engine/loop/budget.py).
    reasoning_budget: ReasoningBudget | None = None
    # The request's field that asked for the constraint (its errors name it).
    constraint_from: str = "response_format"
    # OpenAI's Predicted Outputs: text the answer is expected to resemble, drafted first
    # wherever the answer is in step with it (engine/drafting/prediction.py); "": none.
    prediction: str = ""
    choices: int = 1  # completions of this prompt (n, n_cmpl): the worker runs them in turn


def build_work(
    vocab: Vocabulary, n_ctx: int, defaults: Defaults, req: ChatRequest | CompletionRequest
) -> Work:
    """`vocab`: the target's tokenizer (the engine runs elsewhere: isolation.py)."""
    turns: tuple[tuple[str, str], ...] = ()
    use, spec = None, None
    found: Markers | None = None  # a completion's prompt is the client's: not split
    source = _one_constraint(req)  # before any is compiled
    if isinstance(req, ChatRequest):
        kind: Literal["chat", "completion"] = "chat"
        # With tools, a JSON format is the other answer the tools' grammar admits.
        use, spec = tool_use(req, requested(req, None) if source == "tools" else None)
        tokens, extra_stop, found = chat_tokens(vocab, req, defaults.reasoning_format)
        param = "messages"
        if not extra_stop and not _has_tools(req):  # rendered by the target's template
            turns = tuple((t["role"], t["content"]) for t in _turns(req))
    else:
        # A fill-in-the-middle prompt where the request has a suffix (fim.py).
        kind, extra_stop, param = "completion", (), "prompt"
        tokens = fim.prompt_tokens(vocab, req, n_ctx, defaults.max_tokens) or \
            _tokenize(vocab, req.text())
    _check_prompt(tokens, n_ctx, param)
    limit = _token_limit(req, n_ctx)
    max_tokens = defaults.max_tokens if limit is None else limit
    sampling = _sampling(req, defaults.sampling)
    if spec is None:
        spec = requested(req, defaults.constraint)
    if req.ignore_eos and spec is not None:
        raise APIError(400, f"ignore_eos cannot be combined with {_whose(source)}: a "
                       "constraint ends the output with an end-of-generation token",
                       param="ignore_eos", code="unsupported_parameter")
    if spec is not None and found is not None:
        spec = _after_reasoning(spec, found, source)
    # Several calls in one answer: a call made a second time ends the answer (tools.py).
    repeat = (REPEATED_CALL,) if use is not None and use.parallel else ()
    stops = req.stops + extra_stop + repeat + fim.line_stops(req)
    return Work(kind, tokens, max_tokens, sampling, stops, spec,
                req.n_logprobs, turns, use, found, ignore_eos=req.ignore_eos,
                reasoning_budget=_budget(vocab, found, req),
                constraint_from=source or "response_format",
                prediction=req.prediction.text() if req.prediction else "",
                choices=req.choices)


def _budget(vocab: Vocabulary, found: Markers | None,
            req: ChatRequest | CompletionRequest) -> ReasoningBudget | None:
    """The request's reasoning budget in the target's tokens: its close forced once the
    reasoning has run that many (engine/loop/budget.py). None without one, or where the
    answer is not split into reasoning (nothing to budget)."""
    tokens = req.reasoning_budget if isinstance(req, ChatRequest) else None
    if tokens is None or found is None:
        return None

    def ids(text: str) -> tuple[int, ...]:
        return tuple(vocab.tokenize(text, add_bos=False, special=True))

    return ReasoningBudget(close=ids(found.close), tokens=tokens,
                           open=() if found.starts_open else ids(found.open))


def _check_prompt(tokens: list[int], n_ctx: int, param: str) -> None:
    """The client's 400 for a prompt with nothing in it or no room left after it."""
    if not tokens:
        raise APIError(400, "the prompt is empty", param=param)
    if len(tokens) >= n_ctx:
        raise APIError(
            400,
            f"the prompt is {len(tokens)} tokens but the context window holds {n_ctx}; "
            "shorten it (or restart the server with a larger --n-ctx)",
            param=param,
            code="context_length_exceeded",
        )


def _token_limit(req: ChatRequest | CompletionRequest, n_ctx: int) -> int | None:
    """The tokens asked for (llama-server's n_predict first, as it reads it; -1: as many
    as fit). More than the window holds is served as llama-server and Ollama serve Claude
    Code's 32000: the answer runs until the window is full (finish "context": OpenAI's
    "length", Anthropic's model_context_window_exceeded); n_ctx never ends it sooner."""
    asked = req.token_limit
    if fim.prompt_only(req):
        return 0
    if req.n_predict is not None:
        if req.n_predict == 0 or req.n_predict < -1:
            raise APIError(400, f"n_predict must be -1 (as many tokens as fit) or at least "
                           f"1, not {req.n_predict}", param="n_predict")
        asked = n_ctx if req.n_predict == -1 else req.n_predict
    return None if asked is None else min(asked, n_ctx)


def _sampling(req: ChatRequest | CompletionRequest, base: SamplingParams) -> SamplingParams:
    """The request's sampling over the server's; a value out of range is its 400."""
    try:
        return SamplingParams(
            temperature=base.temperature if req.temperature is None else req.temperature,
            top_k=base.top_k if req.top_k is None else req.top_k,
            top_p=base.top_p if req.top_p is None else req.top_p,
            min_p=base.min_p if req.min_p is None else req.min_p,
            seed=base.seed if req.seed is None else req.seed,
            penalties=_penalties(req, base.penalties or Penalties()),
        )
    except InvalidParameterError as exc:
        raise APIError(400, str(exc)) from None


def _penalties(req: ChatRequest | CompletionRequest, base: Penalties) -> Penalties:
    """The request's penalties over the server's (SamplingParams drops them if off)."""
    repeat = req.repeat_penalty if req.repeat_penalty is not None else req.repetition_penalty
    return Penalties(
        repeat=base.repeat if repeat is None else repeat,
        last_n=base.last_n if req.repeat_last_n is None else req.repeat_last_n,
        presence=base.presence if req.presence_penalty is None else req.presence_penalty,
        frequency=base.frequency if req.frequency_penalty is None else req.frequency_penalty)


def _after_reasoning(spec: ConstraintSpec, found: Markers, source: str | None) -> ConstraintSpec:
    """The constraint on the answer only, the reasoning before it free; compiled now,
    as `constraint` compiles the request's own. source: the request's field that asked
    for it (None: the server's own)."""
    try:
        wrapped = constrain_answer(spec, found)
        wrapped.grammar()
    except ConstraintError as exc:
        raise APIError(400, f"{_whose(source)} cannot follow this model's reasoning ({exc}); "
                       "restart the server with --reasoning-format none to constrain the "
                       "whole output", param=source or "response_format") from None
    return wrapped


def _whose(source: str | None) -> str:
    return source or "the server's --json-schema/--grammar/--regex"


def requested(req: ChatRequest | CompletionRequest,
              default: ConstraintSpec | None) -> ConstraintSpec | None:
    """The request's constraint besides its tools: llama-server's `grammar` (GBNF text)
    or `json_schema` ({}: any object, as llama-server reads it), else its
    response_format (`constraint`); `_one_constraint` has seen that at most one is set."""
    if req.grammar:  # "": none, as llama-server reads it
        return _compiled(ConstraintSpec("grammar", req.grammar), "grammar", None)
    if req.json_schema is not None:
        spec = ConstraintSpec.json_schema(req.json_schema) if req.json_schema else \
            ConstraintSpec("json_object")
        return _compiled(spec, "json_schema", "invalid_json_schema")
    return constraint(req.response_format, default)


def constraint(fmt: ResponseFormat | None, default: ConstraintSpec | None) -> ConstraintSpec | None:
    """`response_format` as a constraint (the server's own when the request has none),
    its schema compiled now so that a bad one is the request's 400 before it waits in
    the queue."""
    if fmt is None:
        return default
    if fmt.type == "text":
        if fmt.schema_ is not None:
            raise APIError(400, "response_format.schema needs the type json_object or "
                           "json_schema, not text", param="response_format")
        return None
    schema = _format_schema(fmt)
    spec = ConstraintSpec("json_object") if schema is None else ConstraintSpec.json_schema(schema)
    return _compiled(spec, "response_format", "invalid_json_schema")


def _format_schema(fmt: ResponseFormat) -> dict[str, Any] | None:
    """The schema a JSON response format follows (None: any object): OpenAI's
    json_schema.schema, or llama-server's schema beside the type (an empty one: any
    object with json_object, as llama-server reads it)."""
    wrapped = fmt.json_schema.schema_ if fmt.json_schema is not None else None
    if wrapped is not None and fmt.schema_ is not None:
        raise APIError(400, "response_format holds two schemas, schema and json_schema.schema;"
                       " send one", param="response_format", code="unsupported_parameter")
    if fmt.type == "json_object":
        return fmt.schema_ or None
    if wrapped is None and fmt.schema_ is None:
        raise APIError(400, "response_format.json_schema.schema is missing: a json_schema "
                       "response format needs the schema", param="response_format")
    return wrapped if wrapped is not None else fmt.schema_


def _compiled(spec: ConstraintSpec, param: str, code: str | None) -> ConstraintSpec:
    try:
        spec.grammar()
    except ConstraintError as exc:
        raise APIError(400, f"{param}: {exc}", param=param, code=code) from None
    return spec


def _one_constraint(req: ChatRequest | CompletionRequest) -> str | None:
    """The request's field that constrains the output (None: none does). Each constrains
    the whole of it and one could only be dropped, so two are refused by name instead,
    before either is compiled. Tools in use constrain the answer to their calls (and,
    under "auto", to free text)."""
    fmt = req.response_format
    given = [name for name, on in (
        ("grammar", bool(req.grammar)), ("json_schema", req.json_schema is not None),
        ("response_format", fmt is not None and fmt.type != "text"),
        ("tools", isinstance(req, ChatRequest) and bool(req.tools)
         and req.tool_choice != "none")) if on]
    if len(given) < 2:
        return given[0] if given else None
    param = [name for name in given if name != "tools"][-1]
    if given[-1] != "tools" or len(given) > 2:
        raise APIError(400, f"{' and '.join(given)} cannot be combined: each constrains the "
                       "whole output; send one", param=param, code="unsupported_parameter")
    if param == "grammar":  # a GBNF grammar cannot be one branch of the tools' Lark one
        raise APIError(400, "grammar cannot be combined with tools: the answer follows the "
                       "tools' call format; leave one out (or send tool_choice: \"none\")",
                       param=param, code="unsupported_parameter")
    # A JSON format with tools: the answer is calls or JSON of that format (tools.py).
    return "tools"


def _tokenize(vocab: Vocabulary, text: str) -> list[int]:
    """As SpeculativeDecoder.tokenize: BOS if the model wants one, special tokens parsed."""
    return vocab.tokenize(text, add_bos=vocab.adds_bos, special=True)


def chat_tokens(target: Vocabulary, req: ChatRequest, fmt: Format = "auto") -> tuple[
        list[int], tuple[str, ...], Markers | None]:
    """The conversation in the target's chat template (as `specllama chat` renders it),
    and the markers of the reasoning its answer begins with (reasoning.py); a plain
    'User: / Assistant:' format when the target has none."""
    tools = req.tools  # under "none" too: the model knows them; its answer is read as text
    template = target.chat_template()
    extra = variables(req.reasoning_effort)
    if template_has_tools(template) and _has_tools(req):
        messages = native_messages(req.messages)  # its 400s name the message, not the template
        try:
            rendered = target.format_chat(
                messages,
                tools=[t.model_dump(exclude_none=True) for t in tools] if tools else None,
                **extra)
        except Exception as exc:
            raise APIError(400, "the model's chat template refused these messages: "
                           f"{_one_line(exc)}", param="messages") from None
        return _reasoned(target, template, rendered, req, fmt)
    turns = generic_messages(req.messages, tools)
    if template is None:
        return _tokenize(target, plain_prompt(turns)), PLAIN_STOP, None
    try:
        rendered = target.format_chat(turns, **extra)
    except Exception as exc:  # a template can fail in any jinja2 way
        folded = _render_folded(target, turns, extra)
        if folded is None:
            raise APIError(
                400,
                f"the model's chat template refused these messages: {_one_line(exc)}",
                param="messages",
            ) from None
        rendered = folded
    return _reasoned(target, template, rendered, req, fmt)


def _reasoned(target: Vocabulary, template: str | None, rendered: str, req: ChatRequest,
              fmt: Format) -> tuple[list[int], tuple[str, ...], Markers | None]:
    """The rendered prompt's tokens (its reasoning closed where thinking is off and the
    template cannot say so) and the markers of the reasoning the answer begins with."""
    if req.reasoning_effort == "none":
        rendered = thinking_off(template, rendered)
    found = markers(template, rendered, fmt)
    return target.tokenize_chat(rendered), (), found and with_tokens(found, target)


def _turns(req: ChatRequest) -> list[dict[str, str]]:
    return generic_messages(req.messages, None)


def _has_tools(req: ChatRequest) -> bool:
    """Tools offered, or earlier calls and their answers in the conversation."""
    return bool(req.tools) or any(
        m.tool_calls or m.role == "tool" for m in req.messages)


def _render_folded(target: Any, turns: list[dict[str, Any]],
                   extra: dict[str, Any]) -> str | None:
    """Templates that refuse the system role (Gemma's, Mistral's) get it prepended to
    the first user message instead; None when that does not help either."""
    system = "\n\n".join(t["content"] for t in turns if t["role"] == "system")
    rest = [t for t in turns if t["role"] != "system"]
    if len(rest) == len(turns):
        return None
    for i, turn in enumerate(rest):
        if turn["role"] == "user":
            rest[i] = {**turn, "content": f"{system}\n\n{turn['content']}"}
            break
    try:
        return target.format_chat(rest, **extra)
    except Exception:
        return None


def plain_prompt(turns: list[dict[str, Any]]) -> str:
    parts = []
    for t in turns:
        if t["role"] == "system":
            parts.append(f"{t['content']}\n\n")
        else:
            parts.append(f"{'User' if t['role'] == 'user' else 'Assistant'}: {t['content']}\n")
    return "".join(parts) + "Assistant:"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
