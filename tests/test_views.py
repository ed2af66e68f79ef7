"""The views of one loaded model (engine/llama/context.py): a `Model` drives sequence 0
of its context, a `SeqView` another sequence of it (`serve --parallel`), an `MtpDraft` a
context of its own over the same weights. Each keeps its own sequence's state; what the
views of a context share is one `Context`, held by reference and never copied."""

from __future__ import annotations

import pytest
from hybridmodels import write_tiny_qwen35

from specllama.engine.llama import Model
from specllama.engine.llama.batched import Batcher, SeqView
from specllama.engine.llama.mtp import MtpDraft


def handles_of(model: Model) -> list[object]:
    shared = model.shared
    return [shared.ctx, shared.mem, shared.batch]


def test_a_seq_view_shares_its_models_context_and_keeps_its_own_state(tiny_target):
    base = Model(tiny_target, n_ctx=256, n_threads=1, n_seq=2)
    batcher = Batcher(base)
    try:
        view = SeqView(batcher, 1)
        assert view.shared is base.shared and (base.seq, view.seq) == (0, 1)
        # no handle of the context is held by the view itself (a copy would outlive a
        # change of the context, as a copied n_threads did)
        own = [v for v in vars(view).values() if v is not view.shared]
        assert not [h for h in handles_of(base) if any(v is h for v in own)]
        a = base.tokenize("the cat sat on the mat")
        b = base.tokenize("once upon a time there was a", add_bos=False)
        view.decode(a)
        base.decode(b, "all")
        view.decode(a[:2])
        assert (base.cached, view.cached) == (b, a + a[:2])
        assert (base.pos_max(), view.pos_max()) == (len(b) - 1, len(a) + 1)
        assert (base.tokens_evaluated, view.tokens_evaluated) == (len(b), len(a) + 2)
        assert (base.decode_calls, view.decode_calls) == (1, 2)
        assert view.rewinder is not base.rewinder and view.rewinder.seq == 1
        view.sync_to(a)
        assert (base.cached, view.cached) == (b, a) and base.pos_max() == len(b) - 1
        # what changes on the context after the view was made, every view of it sees
        base.set_threads(3)
        assert view.n_threads == 3
        view.set_threads(2)
        assert base.n_threads == 2
        view.clear()
        assert (base.cached, view.cached, view.pos_max()) == (b, [], -1)
        assert base.pos_max() == len(b) - 1
    finally:
        batcher.close()
        base.close()


@pytest.fixture(scope="module")
def mtp_target(tmp_path_factory):
    return write_tiny_qwen35(tmp_path_factory.mktemp("views") / "qwen35-mtp.gguf", mtp=True)


def test_an_mtp_draft_has_a_context_of_its_own_over_the_targets_weights(mtp_target):
    target = Model(mtp_target, n_ctx=256, n_threads=1)
    mtp = MtpDraft(target)
    try:
        assert mtp.shared is not target.shared and mtp.shared.model is target.shared.model
        assert (mtp.path, mtp.n_ctx, mtp.n_batch) == (target.path, target.n_ctx, 256)
        own = [v for v in vars(mtp).values() if v is not mtp.shared]
        assert not [h for h in handles_of(target) if any(v is h for v in own)]
        tokens = target.tokenize("the cat sat on the")
        target.decode(tokens)
        mtp.decode(tokens[:3])
        assert (target.cached, mtp.cached) == (tokens, tokens[:3])
        assert (target.pos_max(), mtp.pos_max()) == (len(tokens) - 1, 2)
        assert (target.tokens_evaluated, mtp.tokens_evaluated) == (len(tokens), 3)
        mtp.set_threads(2)
        assert (mtp.n_threads, target.n_threads) == (2, 1)
    finally:
        mtp.close()
        target.close()
