"""--draft-threads: the draft model drafting ahead on threads of its own while the target
verifies, through the command line (the exactness tests are in tests/test_exactness.py)."""

import json

from test_cli import assert_one_line_error


def test_drafting_ahead_gives_the_target_alones_greedy_text(run, tiny):
    args = ("generate", "the cat sat on the mat", *tiny, "--raw", "--max-tokens", 160,
            "--temperature", 0, "--drafters", "model")
    alone = run(*args, "--draft-max", 0)  # (on `tiny`'s one thread: two spin on 2 cores)
    ahead = run(*args, "--threads", 2, "--draft-max", 2, "--draft-threads", 1, "--json")
    assert alone.exit_code == 0 and ahead.exit_code == 0, ahead.output
    report = json.loads(ahead.stdout)
    assert report["text"] == alone.stdout.rstrip("\n")
    assert report["settings"]["threads"] == 2 and report["settings"]["draft_threads"] == 1
    assert report["stats"]["ahead"] > 0 and report["stats"]["ahead_accepted"] > 0


def test_draft_threads_are_checked_in_one_line(run, tiny, tiny_target):
    base = ("generate", "x", "--raw", "--max-tokens", 2)
    assert_one_line_error(run(*base, *tiny, "--threads", 2, "--draft-max", 2,
                              "--draft-threads", 2),
                          "--draft-threads must be fewer than the 2 threads")
    assert_one_line_error(run(*base, *tiny, "--draft-threads", -1),
                          "--draft-threads: must be 'auto' or an integer >= 0")
    assert_one_line_error(
        run(*base, "--target", str(tiny_target), "--draft", "lookup", "--threads", 2,
            "--draft-threads", 1),
        "--draft-threads needs the draft model among the drafters")


def test_auto_takes_turns_on_one_thread(run, tiny):
    result = run("generate", "the cat", *tiny, "--raw", "--max-tokens", 4, "--threads", 1,
                 "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["settings"]["draft_threads"] == 0
