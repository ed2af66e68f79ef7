"""Constrained output: a JSON schema, a GBNF grammar or a regex the generated tokens must
follow, through llguidance (the constraint engine llama.cpp itself builds with).

Exactness: where a constraint holds, the target alone draws from p masked to the tokens
the constraint allows and renormalised (the logits of the others set to -inf before
temperature, top-k, top-p and min-p). Speculation keeps that law with the ordinary rule
when both sides are masked at the same state of the constraint: the draft model draws
from its own masked q, and each row i of the verify pass is masked at the state after
d_1..d_i. `Constraint` keeps those states along a draft chain (`advance`, `row_mask`)
and puts the matcher back to the committed tokens once the round is settled (`settle`).

Forced tokens: where the constraint allows one continuation only (`{"name": "`, a closing
bracket), llguidance computes its tokens without any model (`forced`); they join a draft
as deterministic proposals (q all on them), so they cost verification, never drafting.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..errors import ConstraintError

ConstraintKind = Literal["json_schema", "json_object", "grammar", "regex"]

#: JSON on one line with ", " and ": " between items: how models write JSON inline, and no
#: free whitespace for a small model to loop in; the separators are then forced tokens.
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


@dataclass(frozen=True)
class ConstraintSpec:
    """What the output must follow: `text` is a JSON schema (as JSON text), GBNF or Lark
    grammar text, or a regex; json_object is any JSON object (text unused)."""

    kind: ConstraintKind
    text: str = ""

    @classmethod
    def json_schema(cls, schema: str | dict[str, Any]) -> ConstraintSpec:
        """A schema as a dict, JSON text, or the path of a file holding it."""
        if isinstance(schema, dict):
            return cls("json_schema", json.dumps(schema))
        text = schema
        if not text.lstrip().startswith(("{", "[")):
            text = _read(text, "JSON schema")
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConstraintError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(parsed, (dict, bool)):
            raise ConstraintError("a JSON schema must be a JSON object")
        return cls("json_schema", text)

    @classmethod
    def grammar_file(cls, path: str | Path) -> ConstraintSpec:
        """A GBNF (llama.cpp's grammar format) or Lark grammar file."""
        return cls("grammar", _read(str(path), "grammar"))

    def describe(self) -> str:
        return {"json_schema": "JSON schema", "json_object": "JSON object",
                "grammar": "grammar", "regex": "regex"}[self.kind]

    def grammar(self) -> str:
        """llguidance's grammar for this constraint; ConstraintError if it is malformed."""
        import llguidance
        from llguidance.gbnf_to_lark import any_to_lark

        try:
            if self.kind == "json_object":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    {"type": "object"}, overrides=JSON_OPTIONS)  # type: ignore[arg-type]
            elif self.kind == "json_schema":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    self.text, overrides=JSON_OPTIONS)  # type: ignore[arg-type]
            elif self.kind == "regex":
                grammar = llguidance.LLMatcher.grammar_from_regex(self.text)
            else:
                grammar = llguidance.LLMatcher.grammar_from_lark(any_to_lark(self.text))
        except Exception as exc:  # llguidance raises ValueError; the converter others
            raise ConstraintError(f"the {self.describe()} is not valid: {_one_line(exc)}") from None
        # Compiled now, without a vocabulary: a wrong type, a dangling $ref or a keyword
        # llguidance does not implement ("not", "if") fails here, before anything loads.
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        if failed:
            raise ConstraintError(f"the {self.describe()} is not valid: "
                                  f"{_one_line(Exception('; '.join(messages)))}")
        return grammar


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConstraintError(f"cannot read the {what} file {path}: {reason}") from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


@functools.lru_cache(maxsize=8)
def _compiled(spec: ConstraintSpec, tokenizer: Any) -> Any:
    """A matcher of `spec` over `tokenizer` that has consumed nothing, checked once; each
    generation takes a copy. Compiling costs about 2 ms on a tiny vocabulary and more on
    a real one, every request of a client that sends the same schema each turn: a copy is
    a few microseconds. (The tokenizer is built once per model: vocab.grammar_tokenizer.)"""
    import llguidance

    matcher = llguidance.LLMatcher(tokenizer, spec.grammar(), log_level=0)
    if matcher.is_error():
        problem = _one_line(Exception(matcher.get_error()))
        raise ConstraintError(f"the {spec.describe()} is not valid: {problem}")
    # A grammar that admits no token at all (a schema that is only a $ref cycle)
    # compiles; its first mask errs, and the answer would be an empty "complete" text.
    probe = matcher.deep_copy()
    probe.compute_bitmask()
    if probe.is_error() and not probe.is_accepting():
        raise ConstraintError(f"the {spec.describe()} admits no output (is it only a "
                              "$ref cycle?)")
    return matcher


class Constraint:
    """One generation's constraint state over the target's vocabulary of `n_vocab` ids.

    Between rounds the matcher stands after the committed output. Within a round, the
    tokens proposed so far (the chain) are consumed too, and the mask of every state the
    chain passed is kept: row i of the verify pass reads `row_mask(i)`.
    """

    def __init__(self, spec: ConstraintSpec, tokenizer: Any, n_vocab: int) -> None:
        self.spec = spec
        self.n_vocab = n_vocab
        self._matcher = _compiled(spec, tokenizer).deep_copy()
        self._chain = 0  # tokens proposed beyond the committed output
        self._chain_consumed = 0  # of which the matcher consumed (none after its end)
        self._masks: list[np.ndarray] = []  # mask at chain positions 0.._chain (when computed)
        # Per output token: whether the matcher consumed it (the end-of-generation token
        # that follows the constraint's end is not).
        self._output: list[bool] = []
        self.masks_computed = 0
        self.mask_s = 0.0

    # ------------------------------------------------------------------ the chain
    def allowed(self) -> np.ndarray:
        """The tokens allowed at the current state (bool per target id), cached per chain
        position for `row_mask`."""
        if len(self._masks) > self._chain:
            return self._masks[self._chain]
        t0 = time.perf_counter()
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        mask = np.unpackbits(bits, bitorder="little")[: self.n_vocab].astype(bool)
        if mask.shape[0] < self.n_vocab:  # ids the tokenizer lacks are never allowed
            mask = np.concatenate([mask, np.zeros(self.n_vocab - mask.shape[0], bool)])
        self.mask_s += time.perf_counter() - t0
        self.masks_computed += 1
        del self._masks[self._chain :]
        self._masks.append(mask)
        return mask

    def row_mask(self, i: int) -> np.ndarray:
        """The mask at chain position i (after i chain tokens): computed as the chain went
        past it, or now for the current state."""
        if i < len(self._masks):
            return self._masks[i]
        assert i == self._chain, "a row beyond the chain"
        return self.allowed()

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the constraint allows and no other, from here."""
        if limit <= 0 or self._matcher.is_stopped():
            return []
        return [int(t) for t in self._matcher.compute_ff_tokens()[:limit]]

    def fits(self, tokens: list[int]) -> int:
        """How many of `tokens` the constraint accepts from the current state, in order."""
        return int(self._matcher.validate_tokens(tokens)) if tokens else 0

    def advance(self, tokens: list[int]) -> None:
        """Consume proposed tokens into the chain (each one allowed: see `fits`), keeping
        the mask of every state they pass for verification."""
        for token in tokens:
            self.allowed()
            if self._consume(token):
                self._chain_consumed += 1
            self._chain += 1

    def _consume(self, token: int) -> bool:
        """Consume one allowed token; False for the end of generation after the
        constraint's end, which the matcher does not take."""
        if self._matcher.is_stopped():
            return False
        if not self._matcher.consume_token(token):
            raise ConstraintError(f"internal: token {token} broke the constraint "
                                  f"({_one_line(Exception(self._matcher.get_error()))})")
        return True

    def settle(self, generated: list[int]) -> None:
        """The round is over: drop the chain and consume what joined the output (after a
        stop string cut it, the matcher goes back to where the output now ends)."""
        back = self._chain_consumed + sum(self._output[len(generated) :])
        del self._output[len(generated) :]
        if back:
            self._matcher.rollback(back)
        self._chain = self._chain_consumed = 0
        self._masks.clear()
        for token in generated[len(self._output) :]:
            self._output.append(self._consume(token))

    @property
    def chain(self) -> int:
        return self._chain

    @property
    def complete(self) -> bool:
        """The output so far is a whole match (it may end here)."""
        return bool(self._matcher.is_stopped() or self._matcher.is_accepting())


def masked(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Logits with the tokens the mask forbids at -inf; ids beyond the mask (a draft's
    extra ids) are forbidden too. The mask always allows something (llguidance allows
    end-of-generation where nothing else fits)."""
    n = min(logits.shape[0], mask.shape[0])
    out = np.full(logits.shape[0], -np.inf, dtype=np.float32)
    np.copyto(out[:n], logits[:n], where=mask[:n])
    return out
