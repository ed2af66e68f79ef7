"""How generated text reaches the terminal."""

import io

from specllama.cli.ui import TokenPrinter
from specllama.engine.loop.events import TargetToken, TextFlushed, TokensAccepted


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


def test_stats_count_spliced_tokens_by_origin_and_say_so():
    from rich.console import Console

    from specllama.cli.ui import stats_table
    from specllama.engine.loop.events import RoundVerified
    from specllama.engine.loop.stats import Stats

    def round_of(origins, accepted, source):
        k = len(origins)
        return RoundVerified(drafted=(7,) * k, origins=origins, accepted=accepted, token=8,
                             kind="correction" if accepted < k else "bonus",
                             emitted=accepted + 1, p=(None,) * k, q=(1.0,) * k, source=source,
                             draft_s=0.0, target_s=0.0, seconds=0.0)

    stats = Stats()
    # a model draft of 6 whose tokens 2-4 came from earlier replies; 4 accepted
    stats.record(round_of(("model", "model", "session", "session", "session", "model"), 4,
                          "model"))
    stats.record(round_of(("session",) * 3, 3, "lookup"))  # a lookup draft
    assert (stats.spliced, stats.spliced_accepted) == (3, 2)
    assert stats.origin_drafted == {"session": 6} and stats.origin_accepted == {"session": 5}
    console = Console(file=io.StringIO(), width=200)
    console.print(stats_table(stats))
    assert ("lookup from  session 5/6 accepted (2/3 inside model drafts, following earlier "
            "replies)") in console.file.getvalue()
