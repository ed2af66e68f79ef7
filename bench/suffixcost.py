"""What a lookup costs per round as the suffix cache grows (#28: flat, well under 1% of a
target step), and what the cache costs in memory and time to build.

    python bench/suffixcost.py [--sizes 10000,100000,1000000,10000000] [--lookups 2000]

The archive is filled with documents of 200-800 tokens drawn from a Zipf law over a
49,152-token vocabulary (SmolLM2's size) with a repeated phrase book mixed in, so short
n-grams recur a lot, as in text; each lookup is a round's: a context of 500 tokens that
ends in text from the archive (a match) or not (none), `LookupDraft` searching both the
context and the archive, then drafting up to 8 tokens. No model is loaded.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np

from specllama.engine.lookup import LookupDraft
from specllama.engine.suffixcache import SuffixArchive

VOCAB = 49_152


def documents(total: int, rng: np.random.Generator) -> list[np.ndarray]:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000,10000000")
    ap.add_argument("--lookups", type=int, default=2000)
    args = ap.parse_args()
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
        times: dict[bool, list[float]] = {True: [], False: []}
        for i in range(args.lookups):
            hit = i % 2 == 0
            context = (rng.zipf(1.2, size=500) % VOCAB).tolist()
            if hit:
                doc = docs[int(rng.integers(len(docs)))]
                start = int(rng.integers(0, max(1, len(doc) - 40)))
                context += doc[start : start + 24].tolist()
            else:
                context += (rng.integers(0, VOCAB, size=24)).tolist()
            draft = LookupDraft(archives=[(archive, None)])
            draft.index.sync(context[:-1])  # the index is incremental: only the round counts
            t = time.perf_counter()
            draft.has_match(context)
            draft.chain(context, 8)
            times[hit].append((time.perf_counter() - t) * 1e6)
        cells = []
        for hit in (True, False):
            xs = sorted(times[hit])
            cells.append(f"{statistics.median(xs):.0f}, {xs[int(0.95 * len(xs))]:.0f}")
        print(f"| {archive.n_tokens:,} | {build:.1f} | {rss:.0f} | {cells[0]} | {cells[1]} | "
              f"{sum(len(s) for s in archive.segments.values())} |", flush=True)


if __name__ == "__main__":
    main()
