"""Tool calls as OpenAI defines them, on any model: the tools go into the prompt, the
call is constrained by their JSON schemas, and the text comes back as `tool_calls`.

One format on the output side, whatever the model: each call is

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

(Qwen2.5's and Hermes' own, which their templates ask for). A chat template with a tools
section renders the tools and the conversation's calls itself; any other gets the tools
in a system message that describes this format (GENERIC_INTRO). The grammar then admits
only calls whose name is a tool's and whose arguments follow its `parameters`:
`required` and a named function admit nothing else, `auto` admits text that does not
begin with '<' (after any whitespace) as well.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from ..engine.constraint import JSON_OPTIONS, ConstraintSpec
from ..engine.loop.textstream import Repeat
from ..errors import ConstraintError
from .apierror import APIError
from .schema import ChatRequest, Message, Tool

OPEN, CLOSE = "<tool_call>\n", "\n</tool_call>"
# No client wants the same call twice in one turn, and a small model asked for calls in
# parallel may repeat one until max_tokens: the answer ends where a call repeats one
# it already made (a stop rule: the output is cut, the law before the cut unchanged).
REPEATED_CALL = Repeat(OPEN, CLOSE)

GENERIC_INTRO = (
    "You can call these functions; each line is one, with a JSON schema of its arguments:\n"
    "{tools}\n\n"
    "To call one, answer with only this, one block per call:\n"
    f'{OPEN}{{"name": "<the function\'s name>", "arguments": {{<its arguments>}}}}{CLOSE}\n'
    "A function's answer comes back in <tool_response></tool_response>."
)

Choice = Literal["auto", "required", "named"]
_JSON = json.JSONDecoder()


@dataclass(frozen=True)
class ToolUse:
    """What the answer side needs to know of a request's tools."""

    choice: Choice
    parallel: bool


def tool_use(req: ChatRequest, answer: ConstraintSpec | None = None,
             ) -> tuple[ToolUse | None, ConstraintSpec | None]:
    """How this request uses tools (None: it does not) and the constraint on its output.
    `answer`: the request's JSON format (compiled already), which an answer that is not
    a call follows under tool_choice "auto" (an agent's final output beside its tools)."""
    _distinct_names(req.tools or [])
    choice = req.tool_choice
    if not req.tools and choice not in (None, "none", "auto"):
        raise APIError(400, "tool_choice asks for a call but there are no tools",
                       param="tool_choice")
    if not req.tools or choice == "none":
        return None, None
    tools = req.tools
    if choice is None or isinstance(choice, str):
        mode: Choice = "required" if choice == "required" else "auto"
    else:
        tools = [t for t in tools if t.function.name == choice.function.name]
        if not tools:
            raise APIError(400, f"tool_choice names the function {choice.function.name!r}, "
                           "which is not among the tools", param="tool_choice")
        mode = "named"
    use = ToolUse(mode, req.parallel_tool_calls and mode != "named")
    spec = ConstraintSpec("grammar", grammar(tools, use, answer))
    try:
        spec.grammar()
    except ConstraintError as exc:
        raise APIError(400, f"tools: {exc}", param="tools", code="invalid_json_schema") from None
    return use, spec


def _distinct_names(tools: list[Tool]) -> None:
    """A call names its function: two tools of one name make it ambiguous (and the
    grammar's anyOf would admit either's arguments), so the second is refused."""
    seen: dict[str, int] = {}
    for i, tool in enumerate(tools):
        name = tool.function.name
        if name in seen:
            raise APIError(400, f"tools[{i}].function.name: {name!r} is also the name of "
                           f"tools[{seen[name]}]; each tool needs a name of its own",
                           param="tools")
        seen[name] = i


def grammar(tools: list[Tool], use: ToolUse, answer: ConstraintSpec | None = None) -> str:
    """A Lark grammar (llguidance's, with %json) of the answers `use` admits: calls, or
    under "auto" free text, or JSON of `answer`'s format when there is one (a call is
    never JSON of the format: it opens with the call's tag). A call that is required
    has no other answer, so a format has nothing to constrain then."""
    calls = [{
        "type": "object",
        "properties": {"name": {"const": t.function.name},
                       "arguments": t.function.parameters or
                       {"type": "object", "properties": {}, "additionalProperties": False}},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    } for t in tools]
    schema = {"x-guidance": JSON_OPTIONS, "anyOf": calls}
    other = "TEXT" if answer is None else "answer"
    lines = [
        "start: " + (f"calls | {other}" if use.choice == "auto" else "calls"),
        "calls: call" + ' ("\\n" call)*' * use.parallel,
        f"call: {json.dumps(OPEN)} body {json.dumps(CLOSE)}",
        f"body: %json {json.dumps(schema)}",
    ]
    if use.choice == "auto" and answer is not None:
        shape = {"type": "object"} if answer.kind == "json_object" else json.loads(answer.text)
        lines.append(f"answer: %json {json.dumps({**shape, 'x-guidance': JSON_OPTIONS})}")
    elif use.choice == "auto":
        # Text may not open with '<' after whitespace either: the reasoning split strips
        # that whitespace, and the rest would read as a call the grammar never checked.
        lines.append("TEXT: /\\s*[^<\\s](?s:.*)/")
    return "\n".join(lines) + "\n"


def parse_calls(text: str, cut: bool = False) -> list[dict[str, Any]] | None:
    """The calls in an answer, in OpenAI's shape; None when it is text. `cut`: the answer
    ended at max_tokens, and a call it left unfinished is dropped."""
    calls: list[dict[str, Any]] = []
    rest = text.rstrip()  # a call begins the answer: the grammar says so
    while rest.startswith(OPEN.strip()):
        try:  # the JSON first: its strings may hold "</tool_call>" too
            call, end = _JSON.raw_decode(rest, len(OPEN.strip()) + 1)
        except json.JSONDecodeError:
            call, end = None, 0
        after = rest[end:].lstrip()
        if not isinstance(call, dict) or "name" not in call or \
                not after.startswith(CLOSE.strip()):
            return (calls or None) if cut else None
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": json.dumps(call.get("arguments", {}))}})
        rest = after[len(CLOSE.strip()):].strip()
    if cut and OPEN.startswith(rest):  # max_tokens fell inside the next call's opening tag
        return calls or None
    return calls if calls and not rest else None


def template_has_tools(template: str | None) -> bool:
    return template is not None and "tools" in template


def native_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The conversation for a template that renders tools itself (arguments as objects,
    as Hugging Face's templates expect them)."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        turn: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                                "content": m.text()}
        if m.tool_calls:
            turn["tool_calls"] = [{"type": "function", "id": c.id, "function": {
                "name": c.function.name, "arguments": _arguments(c.function.arguments, i, j)}}
                for j, c in enumerate(m.tool_calls)]
        if m.tool_call_id:
            turn["tool_call_id"] = m.tool_call_id
        out.append(turn)
    return out


def generic_messages(messages: list[Message], tools: list[Tool] | None) -> list[dict[str, str]]:
    """The conversation as plain turns: the tools in the first system message, earlier
    calls as the blocks the model writes, a tool's answer as a user turn."""
    out: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        content = m.text()
        if m.tool_calls:
            blocks = [OPEN + json.dumps({"name": c.function.name, "arguments":
                                         _arguments(c.function.arguments, i, j)}) + CLOSE
                      for j, c in enumerate(m.tool_calls)]
            content = "\n".join(([content] if content else []) + blocks)
        if role == "tool":
            role, content = "user", f"<tool_response>\n{content}\n</tool_response>"
        out.append({"role": role, "content": content})
    if tools:
        listed = "\n".join(json.dumps(t.model_dump(exclude_none=True)) for t in tools)
        intro = GENERIC_INTRO.replace("{tools}", listed)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{intro}"}
        else:
            out.insert(0, {"role": "system", "content": intro})
    return out


def _arguments(text: str, message: int, call: int) -> Any:
    """A call's arguments as JSON (text that is not JSON as sent: the model sees what the
    client wrote); JSON past what Python reads or writes back is the client's 400."""
    try:
        value = json.loads(text)
        # The prompt writes it back no deeper in the stack than this: if this passes, so
        # does that (a RecursionError there would be a 500).
        json.dumps(value)
    except json.JSONDecodeError:
        return text
    except (ValueError, RecursionError) as exc:  # digits past sys.int_info; deep nesting
        why = "JSON nested too deeply to read" if isinstance(exc, RecursionError) else \
            "a number with too many digits to read"
        raise APIError(400, f"messages[{message}].tool_calls[{call}].function.arguments "
                       f"holds {why}", param="messages") from None
    return value
