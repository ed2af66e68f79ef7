"""The engine: everything below the command line, in three jobs.

- `llama/`: the llama.cpp boundary, the only code that imports `llama_cpp`;
- `drafting/`: who proposes tokens (one interface, a chain of drafters);
- `loop/`: the round loop that verifies them exactly, its events and stats.

Shared by those: the acceptance rule's numerics (`sampling`), constraints
(`constraint`) and the one table of settings (`settings`). `decoder` puts a pair
together and is the API; `checks` measures a pair for `specllama pairs check`.
"""
