"""`serve --parallel` with a draft of another tokenizer (`--cross-vocab`): each request
gets, token for token, what it gets alone. And `serve --draft-threads`: applied with one
request at a time, refused beside `--parallel` above 1 (drafting ahead is one
generation's; a parallel engine decodes everything in shared batches on one thread)."""

from __future__ import annotations

from click.testing import CliRunner
from drafts import GREEDY
from test_cli import assert_one_line_error
from test_crossvocab_exactness import DRAFT, PROMPTS
from test_parallel import DRAFTERS, at_once, order

from specllama import SpeculativeDecoder
from specllama.cli import cli
from specllama.engine.drafting.crossvocab import CrossVocabDraft
from specllama.engine.llama import Model
from specllama.loading import RunOptions, serve_engine
from specllama.paths import CACHE_ENV_VAR
from specllama.server.slots import Slots


def load(target, draft, n_seq: int, **kwargs) -> SpeculativeDecoder:
    return SpeculativeDecoder(Model(target, n_ctx=512, n_threads=1, n_seq=n_seq),
                              Model(draft, n_ctx=512, n_threads=1, n_seq=n_seq), **kwargs)


def at_once_and_alone(target, draft, draft_max, **kwargs) -> tuple[list, list, Slots]:
    """Greedy tokens of PROMPTS[:4] alone, one after another, and from four threads on
    three slots."""
    alone = load(target, draft, 1, **kwargs)
    prompts = [alone.tokenize(p) for p in PROMPTS[:4]]
    expected = [alone.generate(p, max_tokens=40, sampling=GREEDY, draft_max=draft_max,
                               drafters=DRAFTERS).tokens for p in prompts]
    alone.close()
    decoder = load(target, draft, 3, **kwargs)
    slots = Slots(decoder)
    try:
        slots.prepare()
        outcomes = at_once(slots, [order(i, p, max_tokens=40, draft_max=draft_max)
                                   for i, p in enumerate(prompts)])
        return expected, [o.result.tokens for o in outcomes], slots
    finally:
        slots.close()


def test_a_cross_vocabulary_pair_serves_requests_at_once_as_alone(tiny_target,
                                                                   tiny_model_factory,
                                                                   monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path))  # the vocabulary map's cache
    draft = tiny_model_factory(seed=0, **DRAFT)
    expected, got, slots = at_once_and_alone(tiny_target, draft, 3, cross_vocab=True)
    assert got == expected
    assert all(isinstance(e.decoder.draft_model, CrossVocabDraft) for e in slots.slots)
    drafted = [e.decoder.draft.tokens_evaluated for e in slots.slots]
    assert sum(drafted) > 0, "the draft model never drafted"


# ------------------------------------------------------------------ --draft-threads


def test_serve_drafts_ahead_on_the_threads_it_is_given(tiny_target, tiny_draft):
    """`serve --draft-threads 1`: the engine process's load applies it (one request at a
    time drafts ahead); auto, serve's default, takes turns."""
    for given, expected in ((1, 1), ("auto", 0)):
        run = RunOptions(target=str(tiny_target), draft=str(tiny_draft),
                         flags=(("threads", 2), ("draft_threads", given)))
        decoder, _, settings = serve_engine(run, False)
        try:
            assert decoder.draft_threads == expected and settings.draft_threads == expected
        finally:
            decoder.close()


def test_draft_threads_with_parallel_above_1_is_a_one_line_error(tiny_target, tiny_draft):
    result = CliRunner().invoke(cli, ["serve", "--port", "0", "--parallel", "2",
                                      "--draft-threads", "1", "--target", str(tiny_target),
                                      "--draft", str(tiny_draft)])
    assert_one_line_error(result, "--draft-threads", "--parallel")
