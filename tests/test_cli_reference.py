"""docs/cli.md is every command's --help, regenerated whenever a flag changes."""

from pathlib import Path

from click.testing import CliRunner

from specllama.cli import cli
from specllama.cli.reference import REGENERATE, render

CLI_MD = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def test_the_checked_in_reference_is_the_generated_one():
    assert CLI_MD.read_text() == render(), (
        f"docs/cli.md is out of date with the commands' --help; regenerate it: {REGENERATE}")


def test_every_command_and_subcommand_has_its_section():
    page = render()
    for path in ("specllama", "specllama generate", "specllama chat", "specllama bench",
                 "specllama serve", "specllama rpc-server", "specllama pairs",
                 "specllama pairs list", "specllama pairs show", "specllama pairs check",
                 "specllama pull"):
        assert f"## `{path}`\n" in page, path
    # the section is the command's own help, as a user sees it
    shown = CliRunner().invoke(cli, ["pairs", "check", "--help"], prog_name="specllama",
                               terminal_width=80).output
    assert f"```text\n{shown}```" in page


def test_the_page_does_not_depend_on_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    narrow = render()
    monkeypatch.setenv("COLUMNS", "200")
    assert render() == narrow
