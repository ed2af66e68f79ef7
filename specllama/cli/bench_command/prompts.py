"""What `specllama bench` runs: its prompts and its modes."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ...engine.drafting.chain import Drafters
from ...engine.settings import DRAFT_MAX_LIMIT
from ...errors import InvalidParameterError

DEFAULT_MODES = "target,1,2,4,auto"


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    prompt: str
    category: str = "user"
    chat: bool = True  # wrap in the model's chat template (when it has one)
    schema: str | None = None  # a JSON schema the output follows (JSON text)
    # What the answer is expected to resemble (OpenAI's Predicted Outputs): the file an
    # edit rewrites; sent only where a bench asks for it (bench.llamaserver --prediction).
    prediction: str | None = None


def _record(obj: Any, where: str, index: int) -> BenchPrompt:
    if isinstance(obj, str):
        obj = {"prompt": obj}
    if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
        raise InvalidParameterError(f"{where}: line {index}: expected a JSON object with a "
                                    "string 'prompt' (or a JSON string)")
    if not obj["prompt"].strip():
        raise InvalidParameterError(f"{where}: line {index}: the prompt is empty")
    chat = obj.get("chat", True)
    if not isinstance(chat, bool):
        raise InvalidParameterError(f"{where}: line {index}: 'chat' must be true or false")
    schema = obj.get("schema")
    if schema is not None and not isinstance(schema, dict):
        raise InvalidParameterError(f"{where}: line {index}: 'schema' must be a JSON object")
    prediction = obj.get("prediction")
    if prediction is not None and not isinstance(prediction, str):
        raise InvalidParameterError(f"{where}: line {index}: 'prediction' must be a string")
    return BenchPrompt(
        id=str(obj.get("id") or f"p{index}"),
        prompt=obj["prompt"],
        category=str(obj.get("category") or "user"),
        chat=chat,
        schema=None if schema is None else json.dumps(schema),
        prediction=prediction,
    )


def parse_prompts(text: str, where: str = "prompts") -> list[BenchPrompt]:
    """JSONL (each line a JSON object with "prompt", optional "id", "category",
    "chat", "schema", "prediction"; or a JSON string), or plain text with one prompt per line. Blank
    lines and lines starting with '#' are skipped."""
    lines = [(i, line) for i, line in enumerate(text.splitlines(), 1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise InvalidParameterError(f"{where}: no prompts in it")
    is_jsonl = all(line.lstrip().startswith(("{", '"')) for _, line in lines)
    out = []
    for i, line in lines:
        if is_jsonl:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidParameterError(f"{where}: line {i}: not valid JSON ({exc.msg})") \
                    from exc
            out.append(_record(obj, where, i))
        else:
            out.append(BenchPrompt(id=f"p{i}", prompt=line.strip()))
    ids = [p.id for p in out]
    dup = next((x for x in ids if ids.count(x) > 1), None)
    if dup is not None:
        raise InvalidParameterError(f"{where}: prompt id {dup!r} appears twice")
    return out


#: The shipped sets, by the name --prompts takes: the default mix (chat, code,
#: summarizing and rewriting a given text), text to copy with changes (lookup's ground),
#: JSON that follows a schema given with each prompt (extraction, a tool call, ...), and
#: raw text to continue, without a chat template (for base models such as Gemma 3 270M).
BUILTIN_SETS = ("bench", "copy", "json", "requests", "edits", "completions", "text")


def builtin_prompts(name: str = "bench") -> list[BenchPrompt]:
    text = resources.files("specllama").joinpath(f"prompts/{name}.jsonl").read_text("utf-8")
    return parse_prompts(text, f"built-in prompts {name!r}")


def load_prompts(path: str | os.PathLike[str]) -> list[BenchPrompt]:
    """A file, or the name of a built-in set (where no such file exists: a folder of that
    name, as this project's bench/, does not hide it)."""
    p = Path(path).expanduser()
    if str(path) in BUILTIN_SETS and not p.is_file():
        return builtin_prompts(str(path))
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidParameterError(f"{p}: cannot read the prompts ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise InvalidParameterError(f"{p}: not UTF-8 text") from exc
    return parse_prompts(text, str(p))


@dataclass(frozen=True)
class Mode:
    name: str  # "target", "k=2", "heuristic", "auto", "context"
    draft_max: int | str
    #: Lookups copy from the suffix cache (earlier outputs, a corpus); "context" is auto
    #: with lookups over each call's own context only (as before the cache).
    draft_cache: bool = True
    #: Who drafts ("auto@lookup>model"); None: the run's --drafters.
    drafters: Drafters | None = None

    @property
    def fixed_k(self) -> int | None:
        return self.draft_max if isinstance(self.draft_max, int) else None


def parse_modes(spec: str | Sequence[str]) -> list[Mode]:
    """'target,1,2,4,auto' (also 'k=2', 'k2', 'heuristic', '0' = target, 'context' = auto
    drafting from each call's context alone, not the suffix cache); any of them but target
    with '@' and drafters joined by '+' ('auto@lookup>model', '4@lookup+model')."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    modes: list[Mode] = []
    for raw in items:
        item, at, chain = raw.strip().lower().partition("@")
        if not item:
            continue
        drafters = Drafters.parse(chain.split("+")) if at else None
        if item in ("target", "0", "k=0", "k0"):
            mode = Mode("target", 0)
        elif item in ("auto", "heuristic"):
            mode = Mode(item, item)
        elif item == "context":
            mode = Mode(item, "auto", draft_cache=False)
        else:
            digits = item.removeprefix("k=").removeprefix("k")
            if not digits.isdigit() or not 1 <= int(digits) <= DRAFT_MAX_LIMIT:
                raise InvalidParameterError(
                    f"bench mode {raw.strip()!r}: expected 'target', 'auto', 'context', "
                    f"'heuristic' or a draft length 1..{DRAFT_MAX_LIMIT}"
                )
            mode = Mode(f"k={int(digits)}", int(digits))
        if drafters is not None and mode.draft_max != 0:
            mode = Mode(f"{mode.name}@{'+'.join(drafters)}", mode.draft_max,
                        mode.draft_cache, drafters)
        if mode not in modes:
            modes.append(mode)
    if not modes:
        raise InvalidParameterError("no bench modes given")
    return modes
