"""How generated text reaches the terminal."""

import io

from specllama.cli.ui import TokenPrinter
from specllama.engine.events import TargetToken, TextFlushed, TokensAccepted


def test_token_printer_colours_accepted_and_target_tokens():
    out = io.StringIO()
    printer = TokenPrinter(out, color=True)
    printer.show(TokensAccepted((1, 2), "Hello"))
    printer.show(TargetToken(3, " world", "correction"))
    printer.show(TextFlushed("!"))
    assert out.getvalue() == "\x1b[32mHello\x1b[0m\x1b[33m world\x1b[0m!"
    assert printer.printed == "Hello world!"


def test_token_printer_plain():
    out = io.StringIO()
    printer = TokenPrinter(out, color=False)
    printer.show(TokensAccepted((1,), "Hello"))
    printer.show(TargetToken(3, " world", "plain"))
    assert out.getvalue() == "Hello world"
