"""`python -m bench.fuzz`: runs the fuzzer's command line (cli.py)."""

from bench.common import run
from bench.fuzz.cli import main

if __name__ == "__main__":
    run(main)
