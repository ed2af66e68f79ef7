"""A chat saved to a file: JSON (`.json`) or Markdown."""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...engine.drafting.chain import Drafters
from ...engine.loop.stats import Stats
from ...errors import InvalidParameterError
from ...loading import RunSettings


@dataclass
class Message:
    role: str  # "user" or "assistant"
    content: str
    finish_reason: str | None = None  # assistant messages: why the reply ended


@dataclass(frozen=True)
class Transcript:
    """A chat as saved: messages before `first_kept` had left the context window."""

    settings: RunSettings
    system: str | None
    messages: Sequence[Message]
    first_kept: int
    totals: Stats

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "specllama-chat/1",
            "saved": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "settings": self.settings.as_dict(),
            "system": self.system,
            "messages": [
                {
                    "role": m.role,
                    "content": m.content,
                    **({"finish_reason": m.finish_reason} if m.finish_reason else {}),
                    **({"dropped_from_context": True} if i < self.first_kept else {}),
                }
                for i, m in enumerate(self.messages)
            ],
            "stats": self.totals.to_dict(),
        }

    def save(self, path: str | Path) -> str:
        """Write it: JSON for *.json, Markdown otherwise. Returns the format."""
        path = Path(path).expanduser()
        data = self.to_dict()
        if path.suffix.lower() == ".json":
            body, kind = json.dumps(data, ensure_ascii=False, indent=2) + "\n", "JSON"
        else:
            body, kind = _markdown(data), "Markdown"
        try:
            path.write_text(body, encoding="utf-8")
        except OSError as exc:
            raise InvalidParameterError(f"cannot write {path}: {exc.strerror or exc}") from None
        return kind


def _markdown(data: dict[str, Any]) -> str:
    s = data["settings"]
    lines = ["# specllama chat", ""]
    lines.append(f"- saved: {data['saved']}")
    lines.append(f"- target: `{s['target']}`")
    lines.append(f"- draft: `{s['draft']}`")
    lines.append(
        f"- temperature {s['temperature']}, top_k {s['top_k']}, top_p {s['top_p']}, "
        f"min_p {s['min_p']}, draft_max {s['draft_max']}, drafters {Drafters(s['drafters'])}"
    )
    lines.append("")
    if data["system"]:
        lines += ["## System", "", data["system"], ""]
    for m in data["messages"]:
        lines += [f"## {m['role'].capitalize()}", "", m["content"] or "*(empty)*"]
        notes = []
        if m.get("finish_reason") in ("interrupted", "length", "context", "error"):
            notes.append({"interrupted": "interrupted", "length": "cut at max_tokens",
                          "context": "cut: context window full",
                          "error": "cut by an error"}[m["finish_reason"]])
        if m.get("dropped_from_context"):
            notes.append("dropped from the context window")
        if notes:
            lines += ["", f"*({'; '.join(notes)})*"]
        lines.append("")
    return "\n".join(lines)
