"""What lookup drafts may copy beyond the current context (`--corpus`, `--draft-cache`).

A decoder keeps one `DraftCache` for its life: each call's output joins its history
(origin "session"), so a chat's later turns and a server's later requests draft from
the earlier ones; `load` adds a persisted cache (origin "persisted") and `save` writes
the history back (merged with what other processes wrote meanwhile: `cachefile`);
`add_corpus` indexes a user's files (origin "corpus"), never evicted.

One DraftCache may serve several generations at once (`serve --parallel`): they read the
archives while another's output joins the history. Readers take no lock: adding only
appends (positions stay valid), and an eviction builds a new history rather than
rebuilding the one a generation may be reading. Writers (remember, save) take a lock.

An output is indexed when the history is next read, not when it is remembered: a seeded
call never reads it (its drafts must repeat), and outputs that wait are indexed together
in one sort (a law test's thousands of short seeded calls spent ~15% of their time
indexing outputs nobody read).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..llama import Vocabulary
from .cachefile import fingerprint, load, save
from .corpus import CorpusFile
from .suffixcache import Document, Origin, SuffixArchive, recent

#: The history holds at most this many tokens (about 36 MB indexed; the least recently
#: used outputs go first), in memory and in the persisted file alike.
HISTORY_TOKENS = 1_000_000
#: Each output is remembered with this many prompt tokens before it, so that its start
#: is found after the same prompt ending (a chat template's assistant header).
LEAD = 16
#: The persisted cache is rewritten at most this often (and when the decoder closes).
SAVE_EVERY_S = 30.0


class DraftCache:
    def __init__(self, max_tokens: int = HISTORY_TOKENS) -> None:
        self._history = SuffixArchive(max_tokens)
        self._waiting: list[Document] = []  # remembered, not yet indexed
        self.corpus = SuffixArchive()
        self.path: Path | None = None
        self.fingerprint = ""
        self.warnings: list[str] = []  # what could not be saved, for the caller to show
        self._unsaved = False
        self._saved_at: float | None = None
        self._lock = threading.Lock()  # writers only (see above)

    @property
    def history(self) -> SuffixArchive:
        """The earlier outputs, every remembered one indexed."""
        if self._waiting:
            with self._lock:
                self._index_waiting()
        return self._history

    @history.setter
    def history(self, archive: SuffixArchive) -> None:
        with self._lock:
            self._history, self._waiting = archive, []

    def archives(self, history: bool = True) -> list[tuple[SuffixArchive, Origin | None]]:
        """For `LookupDraft` (each document's origin is its own); `history`: the
        earlier outputs too, not the corpus alone."""
        return [(a, None) for a in ((self.history, self.corpus) if history else (self.corpus,))
                if a.n_documents]

    def remember(self, tokens: Sequence[int], n_prompt: int) -> None:
        """A call's output (`tokens` is prompt + output) joins the history."""
        if len(tokens) <= n_prompt:
            return
        doc = np.asarray(tokens[max(0, n_prompt - LEAD):], np.int32)
        with self._lock:
            self._waiting.append((doc, "session", time.time()))
            self._unsaved = True

    def _index_waiting(self) -> None:
        """The remembered outputs join the indexed history (the lock held)."""
        waiting, self._waiting = self._waiting, []
        history = self._history
        bound = history.max_tokens
        if bound is not None and history.n_tokens + sum(len(d) for d, _, _ in waiting) > bound:
            history = SuffixArchive(bound)
            history.add_many(recent([*self._history.documents(), *waiting], bound))
            self._history = history
        elif waiting:
            history.add_many(waiting)

    def add_corpus(self, files: Sequence[CorpusFile]) -> None:
        self.corpus.add_many([(f.tokens, "corpus", None) for f in files])

    def load(self, path: Path, fingerprint: str) -> str | None:
        """Read a persisted cache (written for this tokenizer): the warning for a file
        that cannot be used (it is rebuilt on the next save), or None."""
        self.path, self.fingerprint = path, fingerprint
        stored, warning = load(path, fingerprint)
        self.history.add_many([(doc, "persisted", used)
                               for doc, used in zip(stored.docs, stored.used)])
        return warning

    def save(self, *, force: bool = False) -> None:
        """Write the history to the persisted cache, if there is one and something new
        to write, at most every SAVE_EVERY_S unless `force` (a server's requests would
        each rewrite the file); a warning goes to `warnings`."""
        if self.path is None or not self._unsaved:
            return
        now = time.monotonic()
        if not force and self._saved_at is not None and now - self._saved_at < SAVE_EVERY_S:
            return
        with self._lock:  # what another generation remembers from here on is unsaved
            self._index_waiting()
            docs = self._history.documents()
            self._unsaved = False
        warning = save(self.path, self.fingerprint, [d for d, _, _ in docs],
                       [u for _, _, u in docs], self.history.max_tokens or HISTORY_TOKENS)
        self._saved_at = now
        if warning:
            self._unsaved = True
            self.warnings.append(warning)

    def forget_session(self) -> None:
        """Forget this process's outputs (kept: the persisted cache, the corpus): each
        run of a benchmark starts from the same cache."""
        with self._lock:
            self._waiting = []
            kept = [d for d in self._history.documents() if d[1] != "session"]
            history = SuffixArchive(self._history.max_tokens)
            history.add_many(kept)
            self._history = history


def tokenizer_fingerprint(model: Vocabulary) -> str:
    """What a persisted cache and a tokenized corpus are keyed by: the vocabulary."""
    return fingerprint(model.token_text, model.n_vocab)
