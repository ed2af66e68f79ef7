"""The responses kept for `previous_response_id` and `GET /v1/responses/{id}`: in memory,
bounded in count and in bytes, the least recently used dropped first.

Each entry holds its whole conversation (the items it was asked, after resolving its own
`previous_response_id`, and the items it answered), so a follow-up sends only its new
items. An entry holds its conversation and its Response as JSON, decoded each time it
is read, so the bytes counted are the memory held: decoded, a 4 MiB schema of empty
lists is 1.4 M objects, about twenty times its JSON. Nothing outlives the process.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, TypeAdapter

from ..apierror import APIError
from .base import Body
from .responses_schema import Turn

# The server's defaults (serve would set them): responses kept, and the bytes of their
# conversations and bodies as JSON.
MAX_RESPONSES = 1024
MAX_BYTES = 64 * 2**20
# A conversation as JSON and back: each item names its type.
_TURNS = TypeAdapter(list[Annotated[Turn, Field(discriminator="type")]])


@dataclass(frozen=True)
class Stored:
    conversation_json: bytes
    body_json: bytes  # the Response object, as answered

    @property
    def size(self) -> int:
        return len(self.conversation_json) + len(self.body_json)

    @property
    def conversation(self) -> tuple[Turn, ...]:
        return tuple(_TURNS.validate_json(self.conversation_json))

    @property
    def body(self) -> Body:
        body: Body = json.loads(self.body_json)
        return body


def stored(conversation: tuple[Turn, ...], body: Body) -> Stored:
    compact = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return Stored(_TURNS.dump_json(list(conversation)), compact.encode())


def not_found(rid: str, param: str | None) -> APIError:
    return APIError(404, f"{'Previous response' if param else 'Response'} with id {rid!r} "
                    "not found (responses are kept in this server's memory, up to its limit, "
                    "and not at all with store: false)", param=param,
                    code="previous_response_not_found" if param else "not_found")


class ResponsesStore:
    """Thread-safe: the routes run on the event loop, and nothing here blocks for long."""

    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Stored] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, rid: str, entry: Stored) -> bool:
        """Keeps it, dropping the least recently used past the limits; False when it
        alone is past them (it is not kept)."""
        if self.max_responses < 1 or entry.size > self.max_bytes:
            return False
        with self._lock:
            self._drop(rid)
            self._entries[rid] = entry
            self._bytes += entry.size
            while len(self._entries) > self.max_responses or self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))
        return True

    def get(self, rid: str, param: str | None = None) -> Stored:
        """The entry (now the most recently used), or the 404 naming `param`."""
        with self._lock:
            entry = self._entries.get(rid)
            if entry is None:
                raise not_found(rid, param)
            self._entries.move_to_end(rid)
            return entry

    def delete(self, rid: str) -> None:
        with self._lock:
            if rid not in self._entries:
                raise not_found(rid, None)
            self._drop(rid)

    def _drop(self, rid: str) -> None:
        entry = self._entries.pop(rid, None)
        if entry is not None:
            self._bytes -= entry.size
