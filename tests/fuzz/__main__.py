"""`python -m tests.fuzz`: runs the fuzzer's command line (cli.py)."""

from bench.lib.common import run

from .cli import main

if __name__ == "__main__":
    run(main)
