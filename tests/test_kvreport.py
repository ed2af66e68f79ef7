"""The one KV-cache report: real tiny models, caches set up as a generation leaves them."""

from specllama.engine.llama import Model
from specllama.engine.llama.kvreport import CacheReport, cache_report


def test_caches_holding_prefixes_of_the_history_are_consistent(tiny_target, tiny_draft):
    target = Model(tiny_target, n_ctx=64, n_threads=1)
    draft = Model(tiny_draft, n_ctx=64, n_threads=1)
    history = target.tokenize("hello world the cat")
    target.decode(history[:-1])  # every token but the newest, as between rounds
    draft.decode(history[:2])  # a draft that did not draft lately lags behind

    report = cache_report(history, target, draft)

    assert report == CacheReport(history=len(history), target=len(history) - 1, draft=2,
                                 consistent=True)
    assert list(report.as_dict()) == ["history", "target", "draft", "consistent"]


def test_a_cache_off_the_history_is_inconsistent(tiny_target, tiny_draft):
    target = Model(tiny_target, n_ctx=64, n_threads=1)
    draft = Model(tiny_draft, n_ctx=64, n_threads=1)
    history = target.tokenize("hello world")
    target.decode(history)
    draft.decode([history[0], history[1] + 1])  # a rejected draft token left in the cache

    assert not cache_report(history, target, draft).consistent


def test_llama_cpp_must_agree_on_the_cache_length(tiny_target):
    target = Model(tiny_target, n_ctx=64, n_threads=1)
    history = target.tokenize("hello world")
    target.decode(history)
    target.cached.pop()  # our bookkeeping says one token less than llama.cpp holds

    report = cache_report(history, target, None)

    assert not report.consistent
    assert report.as_dict() == {"history": len(history), "target": len(history) - 1,
                                "consistent": False}
