"""Fill in the middle: the prompt of a code completion between a prefix and a suffix, built
as llama-server builds it for POST /infill (`format_prompt_infill`, tools/server/
server-common.cpp), and the stops editors ask for beside it (n_indent, t_max_predict_ms).

The order, with the repo-level pattern where the model has FIM_REP and FIM_SEP tokens
(without FIM_SEP, each extra chunk follows a "--- snippet ---" line instead):

    [FIM_REP]myproject\\n [FIM_SEP]{filename}\\n{text} ... [FIM_SEP]filename\\n
    [BOS] [FIM_PRE]{input_prefix}{prompt} [FIM_SUF]{input_suffix} [FIM_MID]

The request's `prompt` (llama.vim: the current line up to the cursor) goes after the
prefix, where llama-server's code puts it (its README says after FIM_MID). Text is never
read as special tokens, but for `prompt`, as llama-server tokenizes each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..engine.llama import FimTokens, Vocabulary
from ..engine.loop.linestops import Deadline, Indent
from ..engine.loop.textstream import Stop
from .apierror import APIError
from .apis.infill_schema import InfillRequest
from .schema import ChatRequest, CompletionRequest

# llama-server's fixed texts (its own TODOs say they may become inputs one day).
REPO_LINE = "myproject\n"
LAST_FILE_LINE = "filename\n"
SNIPPET_LINE = "\n\n--- snippet ---\n\n"
# The batch the prefix and suffix share, llama-server's n_batch under the presets
# llama.vim and llama.vscode document (--fim-qwen-*-default: -b 1024); at most half the
# window here, so a small one still has room for the extra context and the answer.
FIM_BATCH = 1024


@dataclass(frozen=True)
class Chunk:
    """One of input_extra's files: text from elsewhere in the project."""

    filename: str
    text: str


@dataclass(frozen=True)
class Infill:
    """What a request asks to fill in, as text."""

    prefix: str
    suffix: str
    middle: str = ""  # the request's `prompt`: the prefix's last words, tokenized apart
    extra: tuple[Chunk, ...] = ()


@dataclass(frozen=True)
class Parts:
    """The prompt's pieces in tokens, before the budget cuts them."""

    prefix: Sequence[int]
    suffix: Sequence[int]
    middle: Sequence[int]
    extra: Sequence[int]  # input_extra with its separators (extra_tokens)


@dataclass(frozen=True)
class Budget:
    """What the prompt may take: the prefix and suffix share `n_batch` 3:1 (the prompt
    too, from the suffix's share), and the extra context what the window leaves after
    the batch and twice `n_predict`."""

    n_batch: int
    n_ctx: int
    n_predict: int  # the server's default answer length (llama-server: its own -n)

    @classmethod
    def of(cls, n_ctx: int, n_predict: int) -> Budget:
        return cls(min(FIM_BATCH, n_ctx // 2), n_ctx, n_predict)


def extra_tokens(fim: FimTokens, chunks: Sequence[Chunk],
                 text: Callable[[str], list[int]]) -> list[int]:
    """input_extra as llama-server writes it before the prefix: `text` tokenizes."""
    out: list[int] = []
    if fim.rep is not None:
        out += [fim.rep, *text(REPO_LINE)]
    for chunk in chunks:
        if fim.sep is not None:
            out += [fim.sep, *text(chunk.filename + "\n")]
        else:
            out += text(SNIPPET_LINE)
        out += text(chunk.text)
    if fim.sep is not None:  # the file being edited, which llama-server leaves unnamed
        out += [fim.sep, *text(LAST_FILE_LINE)]
    return out


def assemble(fim: FimTokens, parts: Parts, bos: int | None, budget: Budget) -> list[int]:
    """The prompt, cut as llama-server cuts it: the prefix keeps its end, the suffix its
    start, the extra context its end (so the file being edited stays nearest)."""
    assert fim.pre is not None and fim.suf is not None and fim.mid is not None
    quarter = budget.n_batch // 4
    n_prefix = min(len(parts.prefix), 3 * quarter)
    n_suffix = min(len(parts.suffix), max(0, quarter - (2 + len(parts.middle))))
    n_extra = min(max(0, budget.n_ctx - budget.n_batch - 2 * budget.n_predict),
                  len(parts.extra))
    return [*parts.extra[len(parts.extra) - n_extra:], *([] if bos is None else [bos]),
            fim.pre, *parts.prefix[len(parts.prefix) - n_prefix:], *parts.middle,
            fim.suf, *parts.suffix[:n_suffix], fim.mid]


def prompt(vocab: Vocabulary, infill: Infill, budget: Budget) -> list[int]:
    """The prompt in `vocab`'s tokens; its FIM tokens checked first (`check`)."""
    def text(s: str) -> list[int]:
        return vocab.tokenize(s, add_bos=False, special=False)

    fim = vocab.fim
    parts = Parts(text(infill.prefix), text(infill.suffix),
                  vocab.tokenize(infill.middle, add_bos=False, special=True),
                  extra_tokens(fim, infill.extra, text))
    return assemble(fim, parts, vocab.bos if vocab.adds_bos else None, budget)


def check(vocab: Vocabulary, param: str) -> None:
    """The client's 400 when the model cannot fill in the middle."""
    if not vocab.fim.usable:
        raise APIError(400, f"model {vocab.path.name} has no fill-in-the-middle tokens (a "
                       "FIM prefix, suffix and middle); serve a code model that has them",
                       param=param, code="unsupported_parameter")


def requested(req: ChatRequest | CompletionRequest) -> Infill | None:
    """What `req` asks to fill in: /infill's fields, or the legacy completions' `suffix`
    (its prompt the prefix); None for a plain completion (an empty suffix is none)."""
    if isinstance(req, InfillRequest):
        return Infill(req.input_prefix, req.input_suffix, req.prompt,
                      tuple(Chunk(c.filename, c.text) for c in req.input_extra))
    if isinstance(req, CompletionRequest) and req.suffix:
        return Infill(req.text(), req.suffix)
    return None


def prompt_tokens(vocab: Vocabulary, req: ChatRequest | CompletionRequest, n_ctx: int,
                  n_predict: int) -> list[int] | None:
    """The FIM prompt of a request that asks for one (None: it does not)."""
    infill = requested(req)
    if infill is None:
        return None
    check(vocab, "input_prefix" if isinstance(req, InfillRequest) else "suffix")
    return prompt(vocab, infill, Budget.of(n_ctx, n_predict))


def line_stops(req: ChatRequest | CompletionRequest) -> tuple[Stop, ...]:
    """llama-server's n_indent and t_max_predict_ms as stops (0: none)."""
    if not isinstance(req, CompletionRequest):
        return ()
    return (*((Indent(req.n_indent),) if req.n_indent else ()),
            *((Deadline(req.t_max_predict_ms),) if req.t_max_predict_ms else ()))


def prompt_only(req: ChatRequest | CompletionRequest) -> bool:
    """/infill's n_predict 0: the prompt into the caches, nothing generated (llama.vim and
    llama.vscode warm the cache with their extra context this way)."""
    return isinstance(req, InfillRequest) and req.n_predict == 0
