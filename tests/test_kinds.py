"""One door for every kind of draft model (engine/drafting/kinds.py), and one rule for who
drafts (`who_drafts`), asked for the target alone through each way a user can ask."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from drafts import GREEDY
from test_chat import open_session, say  # noqa: F401 - the fixture
from test_cli import assert_one_line_error

import specllama
from specllama import InvalidParameterError, SpeculativeDecoder
from specllama.engine.drafting.chain import NOBODY, Drafters, who_drafts
from specllama.engine.drafting.kinds import KINDS
from specllama.engine.llama import DraftTraits

PACKAGE = Path(specllama.__file__).parent
#: Each concrete kind of draft model, and the module that defines it.
CLASSES = {"MtpDraft": "engine/llama/mtp.py", "AssistantDraft": "engine/llama/assistant.py",
           "Eagle3Draft": "engine/llama/eagle3.py",
           "CrossVocabDraft": "engine/drafting/crossvocab.py"}
REGISTRY = "engine/drafting/kinds.py"


def used_names(path: Path) -> set[str]:
    """The names a module's code uses (imports, calls, isinstance checks; not its prose)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.name for alias in node.names)
    return names


def test_no_concrete_draft_class_is_used_outside_its_module_and_the_registry():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for name in used_names(path) & set(CLASSES):
            if rel not in (CLASSES[name], REGISTRY):
                offenders.append(f"{rel}: {name}")
    assert offenders == []


def test_every_kind_declares_its_traits_once_and_is_named_once():
    names = [kind.name for kind in KINDS]
    assert len(set(names)) == len(names)
    assert {"model", "mtp", "gemma4-assistant", "eagle3"} <= set(names)
    for kind in KINDS:
        assert isinstance(kind.traits, DraftTraits)
        assert (kind.slot is not None) == kind.traits.parallel, kind.name
        assert kind.traits.drafts_as in ("model", "mtp")
        # what it cannot do, it says why (the refusals quote it)
        if not (kind.traits.ahead and kind.traits.parallel):
            assert kind.traits.because


class Stand:
    """What holds the draft model's place, as far as who drafts goes."""

    def __init__(self, drafts_as: str) -> None:
        self.traits = DraftTraits("test", "a test draft", drafts_as=drafts_as)  # type: ignore[arg-type]


@pytest.mark.parametrize("empty", [(), [], "none", NOBODY])
def test_who_drafts_reads_nothing_asked_as_the_default_and_empty_as_nobody(empty):
    model, mtp = Stand("model"), Stand("mtp")
    assert who_drafts(None, model) == ("lookup", "model")
    assert who_drafts(None, mtp) == ("lookup", "mtp")
    assert who_drafts(None, None) == ("lookup",)
    for draft in (model, mtp, None):
        assert who_drafts(empty, draft) == NOBODY and str(who_drafts(empty, draft)) == "none"
    assert Drafters.parse(str(NOBODY)) == NOBODY  # (what /set and --json show round-trips)
    with pytest.raises(InvalidParameterError, match="need a draft model"):
        who_drafts("model", None)
    with pytest.raises(InvalidParameterError, match="name mtp instead"):
        who_drafts("lookup,model", mtp)


# ------------------------------------------------------ the target alone, every way in
@pytest.fixture(scope="module")
def alone(tiny_target):
    """The target's own greedy continuation, with no draft model loaded."""
    dec = SpeculativeDecoder.load(tiny_target, n_ctx=256, n_threads=1)
    try:
        return dec.generate("the cat sat", max_tokens=16, sampling=GREEDY, draft_max=0).tokens
    finally:
        dec.close()


@pytest.mark.parametrize("asked", [(), "none"])
def test_the_python_api_asked_for_nobody_drafts_nothing(tiny_target, tiny_draft_same, alone,
                                                        asked):
    dec = SpeculativeDecoder.load(tiny_target, tiny_draft_same, n_ctx=256, n_threads=1,
                                  drafters=asked)
    try:
        assert dec.default_drafters == NOBODY
        for res in (dec.generate("the cat sat", max_tokens=16, sampling=GREEDY, draft_max=4),
                    dec.generate("the cat sat", max_tokens=16, sampling=GREEDY, draft_max=4,
                                 drafters=asked)):
            assert res.tokens == alone and res.stats.drafted == 0
        # told per call, a decoder with drafters drafts nothing too
        dec.default_drafters = Drafters.parse("lookup,model")
        res = dec.generate("the cat sat", max_tokens=16, sampling=GREEDY, draft_max=4,
                           drafters=asked)
        assert res.tokens == alone and res.stats.drafted == 0
    finally:
        dec.close()


@pytest.mark.parametrize("flags", [["--drafters", "none"], ["--draft-max", "0"]])
def test_the_command_line_asked_for_the_target_alone_drafts_nothing(
        run, tiny_target, tiny_draft_same, flags):
    result = run("generate", "the cat sat", "--raw", "--target", tiny_target, "--draft",
                 tiny_draft_same, "--max-tokens", 16, "--temperature", 0, "--json", *flags)
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["stats"]["drafted"] == 0
    if flags[0] == "--drafters":
        assert report["settings"]["drafters"] == []


def test_a_pair_whose_defaults_name_no_drafters_drafts_nothing(run, tiny_target,
                                                               tiny_draft_same, tmp_path):
    config = tmp_path / "models.toml"
    config.write_text(f'default = "alone"\n[pairs.alone]\ntarget = "{tiny_target}"\n'
                      f'draft = "{tiny_draft_same}"\n[pairs.alone.defaults]\n'
                      'drafters = []\ndraft_max = 4\n', encoding="utf-8")
    result = run("generate", "the cat sat", "--raw", "--config", config, "--max-tokens", 16,
                 "--temperature", 0, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["settings"]["drafters"] == [] and report["stats"]["drafted"] == 0


def test_set_drafters_none_in_chat_drafts_nothing(open_session):  # noqa: F811
    s = open_session(draft_max=4, drafters=("lookup", "model"))
    assert s.set("drafters", "none") == ("drafters", NOBODY)
    say(s, "hello")
    assert s.last_turn.result.stats.drafted == 0
    assert s.set("drafters", "model") == ("drafters", ("model",))


def test_drafters_none_is_refused_nowhere_but_a_name_the_pair_lacks_is(run, tiny_target):
    result = run("generate", "hi", "--target", tiny_target, "--drafters", "none",
                 "--max-tokens", 2)
    assert result.exit_code == 0, result.stderr
    assert_one_line_error(run("generate", "hi", "--target", tiny_target, "--drafters", "model"),
                          "need a draft model, but this pair has none")
