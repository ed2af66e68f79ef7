"""specllama's benchmark scripts. Run each from the repository root as a module:

    python -m bench.ceiling --help

Every script takes its pair the way `specllama` does (bench/lib/common.py); bench/README.md
says what each one measures.
"""
