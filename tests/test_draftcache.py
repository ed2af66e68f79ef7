"""--corpus and --draft-cache through the command line, with real tiny models: drafts
copied from a user's files and from earlier runs, exact, counted by origin; files that
cannot be used are warnings, never tracebacks."""

from __future__ import annotations

import json
import os
import stat

import pytest

from specllama import SpeculativeDecoder
from specllama.engine.sampling import SamplingParams

PROMPT = "the cat sat on the"
GREEDY = ["--temperature", 0, "--raw", "--json", "--max-tokens", 40, "--draft-max", 4,
          "--draft-mode", "lookup"]


@pytest.fixture(scope="module")
def continuation(tiny_target):
    """The target's greedy continuation of PROMPT, as text and tokens."""
    dec = SpeculativeDecoder.load(tiny_target, "lookup", n_ctx=256, n_threads=1)
    res = dec.generate(PROMPT, max_tokens=40, sampling=SamplingParams(temperature=0.0),
                       draft_max=0)
    dec.close()
    return res.text, res.tokens


def stats_of(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_corpus_drafts_are_counted_and_exact(run, tiny, tmp_path, continuation):
    text, tokens = continuation
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "sub" / "notes.txt").write_text(PROMPT + text, encoding="utf-8")
    (docs / "image.bin").write_bytes(b"\x89PNG\x00\x01\x02")
    (docs / ".hidden").write_text("never read", encoding="utf-8")
    result = run("generate", PROMPT, *tiny, *GREEDY, "--corpus", docs)
    out = stats_of(result)
    assert out["tokens"] == tokens  # exact: the target alone's greedy output
    assert out["stats"]["origin_drafted"].get("corpus", 0) > 0
    assert out["settings"]["corpus"] == [str(docs)]
    assert result.stderr.strip().splitlines() == [
        f"warning: skipping {docs / 'image.bin'}: not UTF-8 text"]
    # without the corpus, nothing to copy: the context alone never repeats here
    alone = stats_of(run("generate", PROMPT, *tiny, *GREEDY))
    assert alone["tokens"] == tokens and "corpus" not in alone["stats"]["origin_drafted"]


def test_a_missing_corpus_is_a_one_line_error(run, tiny, tmp_path):
    result = run("generate", PROMPT, *tiny, "--corpus", tmp_path / "nope")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"specllama: error: --corpus: {tmp_path / 'nope'}: no such file or folder"]


def test_the_draft_cache_carries_outputs_to_the_next_run(run, tiny, tmp_path, continuation):
    cache = tmp_path / "state" / "drafts.cache"
    first = stats_of(run("generate", PROMPT, *tiny, *GREEDY, "--draft-cache", cache))
    assert first["tokens"] == continuation[1]
    assert "persisted" not in first["stats"]["origin_drafted"]
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o600  # it holds the user's text
    second = stats_of(run("generate", PROMPT, *tiny, *GREEDY, "--draft-cache", cache))
    assert second["tokens"] == continuation[1]
    drafted = second["stats"]["origin_drafted"].get("persisted", 0)
    assert drafted >= 20 and second["stats"]["target_steps"] < first["stats"]["target_steps"]
    # 'off' reads nothing
    off = stats_of(run("generate", PROMPT, *tiny, *GREEDY, "--draft-cache", "off"))
    assert "persisted" not in off["stats"]["origin_drafted"]


@pytest.mark.parametrize("content", [b"", b"SPLCACHE\x01\x00", os.urandom(300)])
def test_a_corrupt_draft_cache_is_a_warning_and_is_rebuilt(run, tiny, tmp_path, content):
    cache = tmp_path / "drafts.cache"
    cache.write_bytes(content)
    result = run("generate", PROMPT, *tiny, *GREEDY, "--draft-cache", cache)
    assert stats_of(result)["tokens"]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"warning: ignoring the draft cache {cache}: ")
    assert line.endswith("it will be rebuilt")
    again = run("generate", PROMPT, *tiny, *GREEDY, "--draft-cache", cache)
    assert again.stderr == "" and stats_of(again)["stats"]["origin_drafted"].get("persisted")


def test_another_tokenizer_never_reads_the_cache(run, tiny, tmp_path, tiny_other_vocab,
                                                 tiny_draft):
    cache = tmp_path / "drafts.cache"
    stats_of(run("generate", PROMPT, *tiny, *GREEDY, "--draft-cache", cache))
    other = ["--target", tiny_other_vocab, "--draft", "lookup", "--threads", 1, "--n-ctx", 256]
    result = run("generate", PROMPT, *other, *GREEDY, "--draft-cache", cache)
    assert "persisted" not in stats_of(result)["stats"]["origin_drafted"]
    assert result.stderr.strip() == (f"warning: ignoring the draft cache {cache}: written "
                                     "for another tokenizer; it will be rebuilt")


def test_an_answer_remembered_while_the_cache_is_saved_is_saved_next_time(tmp_path,
                                                                           monkeypatch):
    """serve --parallel: another slot's answer joins the history while a save writes the
    file; it must be written by the next save, at shutdown at the latest."""
    import specllama.engine.drafting.draftcache as draftcache
    from specllama.engine.drafting.cachefile import load

    cache = draftcache.DraftCache()
    cache.load(tmp_path / "cache.bin", "fp")
    cache.remember([1, 2, 3, 4, 5, 6], 3)
    save = draftcache.save

    def another_slot_answers_meanwhile(*args, **kwargs):
        cache.remember([7, 8, 9, 10, 11, 12], 3)
        return save(*args, **kwargs)

    monkeypatch.setattr(draftcache, "save", another_slot_answers_meanwhile)
    cache.save(force=True)
    monkeypatch.setattr(draftcache, "save", save)
    cache.save(force=True)
    stored, warning = load(tmp_path / "cache.bin", "fp")
    assert warning is None
    assert [d.tolist() for d in stored.docs] == [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]
