"""What a lookup costs per round as the suffix cache grows (#28: flat, well under 1% of a
target step), and what the cache costs in memory and time to build.

    python -m bench.suffixcost [--sizes 10000,100000,1000000,10000000] [--lookups 2000]

The archive is filled with documents of 200-800 tokens drawn from a Zipf law over a
49,152-token vocabulary (SmolLM2's size) with a repeated phrase book mixed in, so short
n-grams recur a lot, as in text; each lookup is a round's: a context of 500 tokens that
ends in text from the archive (a match) or not (none), `LookupDrafter` searching both the
context and the archive, then drafting up to 8 tokens. No model is loaded.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Sequence

import numpy as np

from bench.lib.common import Spread, parser, percentile, run
from specllama.engine.drafting.lookup import LookupDrafter
from specllama.engine.drafting.suffixcache import SuffixArchive

VOCAB = 49_152


def documents(total: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Documents of 200-800 tokens, `total` tokens at least: phrases of a phrase book
    and Zipf-drawn runs of 8 tokens, half and half."""
    phrases = [rng.zipf(1.3, size=rng.integers(4, 16)) % VOCAB for _ in range(2000)]
    docs, n = [], 0
    while n < total:
        size = int(rng.integers(200, 800))
        parts, length = [], 0
        while length < size:
            part = phrases[int(rng.integers(len(phrases)))] if rng.random() < 0.5 else \
                rng.zipf(1.2, size=8) % VOCAB
            parts.append(part)
            length += len(part)
        doc = np.concatenate(parts)[:size].astype(np.int32)
        docs.append(doc)
        n += len(doc)
    return docs


def context(docs: list[np.ndarray], hit: bool, rng: np.random.Generator) -> list[int]:
    """500 Zipf-drawn tokens, then 24 from a document (a match) or random ones (none)."""
    out = (rng.zipf(1.2, size=500) % VOCAB).tolist()
    if hit:
        doc = docs[int(rng.integers(len(docs)))]
        start = int(rng.integers(0, max(1, len(doc) - 40)))
        return out + doc[start : start + 24].tolist()
    return out + rng.integers(0, VOCAB, size=24).tolist()


def timing_cell(us: Sequence[float]) -> str:
    """'median, p95' in microseconds."""
    return f"{Spread.of(us).median:.0f}, {percentile(us, 95):.0f}"


def lookups(archive: SuffixArchive, docs: list[np.ndarray], n: int,
            rng: np.random.Generator) -> dict[bool, list[float]]:
    """Microseconds of each lookup, with a match (True) and without."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(n):
        hit = i % 2 == 0
        text = context(docs, hit, rng)
        draft = LookupDrafter(archives=[(archive, None)])
        draft.index.sync(text[:-1])  # the index is incremental: only the round counts
        t = time.perf_counter()
        draft.has_match(text)
        draft.continuation(text, 8)
        times[hit].append((time.perf_counter() - t) * 1e6)
    return times


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--sizes", default="10000,100000,1000000,10000000")
    p.add_argument("--lookups", type=int, default=2000)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    print("| cache tokens | build s | RSS MiB | lookup with a match, us (median, p95) "
          "| without, us (median, p95) | segments |")
    print("|---|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        docs = documents(size, rng)
        t0 = time.perf_counter()
        archive = SuffixArchive()
        for doc in docs:
            archive.add(doc, "session")
        build = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        times = lookups(archive, docs, args.lookups, rng)
        print(f"| {archive.n_tokens:,} | {build:.1f} | {rss:.0f} | {timing_cell(times[True])} | "
              f"{timing_cell(times[False])} | "
              f"{sum(len(s) for s in archive.segments.values())} |", flush=True)


if __name__ == "__main__":
    run(main)
