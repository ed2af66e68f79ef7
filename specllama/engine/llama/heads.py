"""A head that drafts over its target's own context: a Gemma 4 assistant (assistant.py)
and an EAGLE3 head (eagle3.py) are small GGUFs whose contexts llama.cpp makes with
`ctx_other` set to the target's, to read its KV cache or its weights."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .context import Context
from .model import Model
from .rewind import Rewinder
from .vocab import Vocabulary


class Head(Model):
    """A `Model` loaded beside its target, reading the target's context."""

    target: Model

    def _load_over(self, path: Path, target: Model, check: Callable[[Any], Any]) -> Any:
        """Load `path` as a head that reads `target`'s context (llama.cpp's ctx_other: a
        Gemma 4 assistant, an EAGLE3 head): one sequence of the target's sizes, cut back
        by trimming. `check(weights)` runs before the context is made, since llama.cpp
        aborts on a head that does not fit its target; what it returns is returned."""
        model = self._load_model(path, ())
        try:
            fit = check(model)
            shared = Context.create(
                model, path, n_ctx=target.n_ctx, n_batch=target.n_batch, n_seq=1,
                n_threads=target.n_threads, n_vocab=self.n_vocab, spares=False,
                snapshots=0, rpc=(), reads=target.shared.ctx)
        except BaseException:
            Vocabulary.close(self)
            raise
        self._view(shared, 0, Rewinder(shared.mem, 0, -1, "trim", 0))
        return fit
