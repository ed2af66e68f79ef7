"""The request bodies of openapi.py's document: the JSON Schemas pydantic gives of the
models each API parses its body with, and what the parsers check beyond the models, set
down beside them so the document says what the server does:

- schema.py's UNSUPPORTED fields an API does not honour: refused (400) unless at their
  no-op value, so each is described as taking only that value, never as working;
- the Responses API's fields it ignores or takes only at a no-op value, and no other
  (apis/responses_schema.py refuses unknown fields by name);
- `null` read as the default (schema.py's before-validators: `"stream": null`);
- the string shorthands: a string for a list of text blocks (Anthropic's), for `input`
  (one user message, the Responses API's);
- the Messages API's caps, checked on the JSON before the model reads it.

tests/test_serve_openapi.py runs schemathesis against a real server with the document:
a body the document calls wrong that the server takes fails there, so a parser that
learns a shorthand or a refusal the table here lacks is found.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, BeforeValidator
from pydantic.json_schema import models_json_schema

from .apis.infill_schema import NOT_RUN, OFF_HERE, OURS, InfillRequest
from .apis.messages_schema import MessagesRequest
from .apis.responses_schema import IGNORED, NO_OP, ResponsesRequest
from .apis.roundstream import RoundsRequest
from .schema import (
    MAX_MESSAGES,
    MAX_STOP,
    MAX_TOOLS,
    UNSUPPORTED,
    ChatRequest,
    CompletionRequest,
    json_equal,
)

JSON = dict[str, Any]  # a JSON document, or a part of one

#: The request models, by their name in the document's components.
REQUESTS: dict[str, type[BaseModel]] = {
    "ChatRequest": ChatRequest, "CompletionRequest": CompletionRequest,
    "ResponsesRequest": ResponsesRequest, "MessagesRequest": MessagesRequest,
    "RoundsRequest": RoundsRequest, "InfillRequest": InfillRequest,
}
# The models schema.parse reads, which refuses UNSUPPORTED's fields they do not honour.
_REFUSING = ("ChatRequest", "CompletionRequest", "RoundsRequest", "InfillRequest")
# (component, property): a string stands for a list (messages_schema._as_blocks, and
# ResponsesRequest's `input`, one user message).
SHORTHANDS = {
    ("MessagesRequest", "system"): "a string: one text block",
    ("InputMessage", "content"): "a string: one text block",
    ("ToolResultBlock", "content"): "a string: one text block",
    ("ResponsesRequest", "input"): "a string: one user message",
}
# The Messages API's caps (messages_schema._check_sizes), not in its model.
CAPS = {"messages": MAX_MESSAGES, "tools": MAX_TOOLS, "stop_sequences": MAX_STOP}
# The Responses API's settings taken only at their no-op value (responses_schema's
# _refuse_settings): the reasoning comes whole, one verbosity.
SETTINGS = {("Reasoning", "summary"): [None, "auto"],
            ("Reasoning", "generate_summary"): [None, "auto"],
            ("TextConfig", "verbosity"): [None, "medium"]}
# Items of `input` other than a message name their type: the discriminator reads an item
# without one as a message (responses_schema._item_type), whatever else it holds.
TYPED_ITEMS = ("FunctionCallItem", "FunctionCallOutputItem")
_REFUSED = ("Not supported by this server: a 400 naming it (code unsupported_parameter) "
            "unless it holds its no-op value, the only value described.")


def request_schemas() -> dict[str, JSON]:
    """The components the request bodies need, their names as REQUESTS', the models
    they nest named after their class (module-qualified where two share a name)."""
    _, defs = models_json_schema([(m, "validation") for m in REQUESTS.values()],
                                 ref_template="#/components/schemas/{model}")
    schemas: dict[str, JSON] = defs["$defs"]
    for name, model in REQUESTS.items():
        _null_defaults(schemas[name], model)
    for name in _REFUSING:
        _refused(schemas[name], UNSUPPORTED, REQUESTS[name].model_fields,
                 getattr(REQUESTS[name], "honours", frozenset()))
    _responses(schemas["ResponsesRequest"])
    for (component, prop), words in SHORTHANDS.items():
        field = schemas[component]["properties"][prop]
        schemas[component]["properties"][prop] = {"anyOf": [
            {"type": "string", "description": words}, field]}
    for prop, cap in CAPS.items():
        _typed(schemas["MessagesRequest"]["properties"][prop], "array")["maxItems"] = cap
    for name, model in REQUESTS.items():
        _choices(schemas[name], getattr(model, "max_choices", None))
    for (component, prop), values in SETTINGS.items():
        schemas[component].setdefault("properties", {})[prop] = {
            "enum": values, "description": _REFUSED}
    for name in TYPED_ITEMS:
        schemas[name]["required"] = sorted({*schemas[name].get("required", []), "type"})
    samplers = schemas["InfillRequest"]["properties"]["samplers"]
    _typed(samplers, "array")["items"] = {"enum": [*OURS, *OFF_HERE, *NOT_RUN]}
    schemas["CountTokensRequest"] = _counting(schemas["MessagesRequest"])
    return schemas


def _null_defaults(schema: JSON, model: type[BaseModel]) -> None:
    """A field whose before-validator reads null as a value (schema.py's `_null_is`)
    takes null too."""
    for name, field in model.model_fields.items():
        for meta in field.metadata:
            if isinstance(meta, BeforeValidator) and _reads_null(meta):
                prop = schema["properties"][field.alias or name]
                schema["properties"][field.alias or name] = {
                    "anyOf": [prop, {"type": "null"}],
                    "description": "null: the default"}


def _reads_null(validator: BeforeValidator) -> bool:
    try:
        return validator.func(None) is not None  # type: ignore[call-arg]
    except Exception:  # a validator of another kind (it takes more, or refuses null)
        return False


def _refused(schema: JSON, refused: dict[str, tuple[Any, ...]], fields: dict[str, Any],
             honoured: frozenset[str]) -> None:
    """UNSUPPORTED's fields the model does not honour: described at their no-op value."""
    for name, values in refused.items():
        if name not in honoured:
            schema["properties"][name] = {"enum": _distinct(values), "description": _REFUSED}
            required = schema.get("required", [])
            if name in fields and name in required:  # a model field refused all the same
                required.remove(name)


def _distinct(values: tuple[Any, ...]) -> list[Any]:
    """JSON Schema's enum holds each value once (1 and 1.0 are one there; 0 and false
    are not)."""
    out: list[Any] = []
    for v in values:
        if not any(json_equal(v, w) for w in out):
            out.append(v)
    return out


def _responses(schema: JSON) -> None:
    """The Responses API refuses a field it does not know (as OpenAI does): its own, the
    ones it ignores, and the ones it takes at their no-op value, and no other."""
    for name in sorted(IGNORED):
        schema["properties"][name] = {"description": "Accepted and ignored: it changes "
                                      "nothing for one local model."}
    _refused(schema, NO_OP, {}, frozenset())
    schema["additionalProperties"] = False


def _typed(prop: JSON, kind: str) -> JSON:
    """The schema of type `kind` in `prop`: itself, or a branch of its anyOf (with null,
    itself maybe in an anyOf with null)."""
    if prop.get("type") == kind:
        return prop
    for branch in prop.get("anyOf", []):
        if branch.get("type") == kind or "anyOf" in branch:
            try:
                return _typed(branch, kind)
            except ValueError:
                continue
    raise ValueError(f"no {kind} in {prop}")


def _choices(schema: JSON, most: int | None) -> None:
    """The choices a request may ask (`n`, `n_cmpl`): schema.parse checks them against
    the model's `max_choices`, which may be fewer than the field's own bound."""
    for name in ("n", "n_cmpl"):
        if most is not None and name in schema["properties"]:
            _typed(schema["properties"][name], "integer")["maximum"] = most


def _counting(messages: JSON) -> JSON:
    """count_tokens' body: a Messages request without max_tokens (it generates nothing)."""
    schema = copy.deepcopy(messages)
    del schema["properties"]["max_tokens"]
    schema["required"] = [r for r in schema.get("required", []) if r != "max_tokens"]
    schema["title"] = "CountTokensRequest"
    return schema
