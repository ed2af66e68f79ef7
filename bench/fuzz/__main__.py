"""`python -m bench.fuzz`: runs the fuzzer's command line (cli.py)."""

from bench.fuzz.cli import main
from bench.lib.common import run

if __name__ == "__main__":
    run(main)
