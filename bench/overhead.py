"""What the round loop costs outside llama.cpp, per token and per round: a specllama
generation against a bare llama_cpp loop that makes the same llama_decode calls.

    python -m bench.overhead [--pair smollm2] [--reps 5] [--max-tokens 192] [--k 4]
    python -m bench.overhead --items      # what each part of a round costs, in us

Two cases, greedy, on the pair's target:
- `alone`: the target alone (draft length 0): one decode of one token per token;
- `self`: the target's own file as the draft model at a fixed length k (`--drafters
  model`, no p_min, no draft cache), so (nearly) every draft is accepted and every round
  is the same: k draft steps, one verify pass of k+1 rows.
The bare loops call llama.cpp's C API through llama_cpp and read each row with one numpy
argmax, or (--temperature) one softmax and one cumulative sum: about the least a Python
program can do for the same tokens. Each repetition runs
ours and the bare loop back to back on fresh caches, in an order that alternates; the
loop's own cost is the difference of their times after the prompt, over the tokens (and
the rounds), each loop's time outside llama_decode timed within the same run. Greedy, the
bare loop must give the same tokens with the same number of llama_decode calls on each
model, or the run stops: an uneven comparison is no figure.
"""

from __future__ import annotations

import ctypes
import time
import timeit
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as lc
import numpy as np

from bench.lib.common import (
    Spread,
    add_pair_options,
    add_run_options,
    machine,
    parser,
    resolve_models,
    run,
)
from specllama import SamplingParams, SpeculativeDecoder
from specllama.engine.sampling import sample

PROMPT = ("Write a long story about a lighthouse keeper who finds a message in a bottle. "
          "Describe the sea, the weather and the keeper's daily work in detail.")
N_CTX = 1024


class Bare:
    """One llama.cpp context of one sequence, set up as specllama's Model sets its own."""

    def __init__(self, path: Path, n_threads: int) -> None:
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        if hasattr(mparams, "load_mtp"):
            mparams.load_mtp = True
        self.model = lc.llama_model_load_from_file(str(path).encode(), mparams)
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = N_CTX
        cparams.n_batch = cparams.n_ubatch = 512
        cparams.n_seq_max = 1
        cparams.swa_full = True
        cparams.n_threads = cparams.n_threads_batch = n_threads
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        self.mem = lc.llama_get_memory(self.ctx)
        self.batch = lc.llama_batch_init(512, 0, 1)
        n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.row_type = ctypes.c_float * n_vocab
        self.calls, self.decode_s = 0, 0.0

    def decode(self, tokens: list[int], start: int, every_row: bool) -> None:
        b = self.batch
        b.n_tokens = len(tokens)
        for i, token in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = token, start + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = every_row
        b.logits[len(tokens) - 1] = True
        t0 = time.perf_counter()
        rc = lc.llama_decode(self.ctx, b)
        self.decode_s += time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError("llama_decode failed")
        self.calls += 1

    def row(self, i: int) -> np.ndarray:
        address = ctypes.cast(lc.llama_get_logits_ith(self.ctx, i), ctypes.c_void_p).value
        return np.frombuffer(self.row_type.from_address(address), dtype=np.float32)

    def argmax(self, i: int) -> int:
        return int(np.argmax(self.row(i)))

    def reset(self, prefix: list[int]) -> None:
        """A fresh cache holding `prefix` (no rows read)."""
        lc.llama_memory_clear(self.mem, True)
        b = self.batch
        b.n_tokens = len(prefix)
        for i, token in enumerate(prefix):
            b.token[i], b.pos[i], b.n_seq_id[i] = token, i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = False
        lc.llama_decode(self.ctx, b)
        self.calls, self.decode_s = 0, 0.0

    def cut(self, n: int) -> None:
        lc.llama_memory_seq_rm(self.mem, 0, n, -1)

    def close(self) -> None:
        lc.llama_batch_free(self.batch)
        lc.llama_free(self.ctx)
        lc.llama_model_free(self.model)


class Pick:
    """How a bare loop reads a row: its argmax (greedy), or a draw from softmax(row / T):
    float32 weights and specllama's own inverse-CDF draw (`sampling.sample`, two levels
    of sums), as cheap as an exact numpy draw gets."""

    def __init__(self, temperature: float, seed: int) -> None:
        self.scale = np.float32(1.0 / temperature) if temperature > 0 else None
        self.rng = np.random.default_rng(seed)

    def dist(self, row: np.ndarray) -> np.ndarray:
        """Weights, unnormalised (the rule's p/q and the draw divide by the sums)."""
        z = row * self.scale
        return np.exp(z - z.max())

    def draw(self, weights: np.ndarray) -> int:
        return sample(weights, self.rng)


def bare_alone(target: Bare, prompt: list[int], n: int, pick: Pick,
               ) -> tuple[list[int], float, int]:
    target.reset(prompt[:-1])
    out, last, t0 = [], prompt[-1], time.perf_counter()
    while len(out) < n:
        target.decode([last], len(prompt) + len(out) - 1, False)
        last = target.argmax(0) if pick.scale is None else pick.draw(pick.dist(target.row(0)))
        out.append(last)
    return out, time.perf_counter() - t0, len(out)


def bare_self(target: Bare, draft: Bare, prompt: list[int], n: int, k: int, pick: Pick,
              ) -> tuple[list[int], float, int]:
    """Speculative decoding, the draft model decoding one token a step; sampled, the
    exact rule (accept d with probability min(1, p(d)/q(d)), else a draw from the
    residual)."""
    target.reset(prompt[:-1])
    draft.reset(prompt[:-1])
    committed, drafted_to, rounds = list(prompt), len(prompt) - 1, 0
    t0 = time.perf_counter()
    while len(committed) - len(prompt) < n:
        limit = min(n - (len(committed) - len(prompt)) - 1, k)
        drafts: list[int] = []
        qs: list[np.ndarray] = []
        feed = committed[drafted_to:]
        for _ in range(max(0, limit)):
            draft.decode(feed, drafted_to, False)
            drafted_to += len(feed)
            if pick.scale is None:
                feed = [draft.argmax(len(feed) - 1)]
            else:
                qs.append(pick.dist(draft.row(len(feed) - 1)))
                feed = [pick.draw(qs[-1])]
            drafts.append(feed[0])
        target.decode([committed[-1], *drafts], len(committed) - 1, bool(drafts))
        rounds += 1
        committed += _verified(target, drafts, qs, pick)
        target.cut(len(committed) - 1)
        if drafted_to > len(committed) - 1:
            draft.cut(len(committed) - 1)
            drafted_to = len(committed) - 1
    return committed[len(prompt):], time.perf_counter() - t0, rounds


def _verified(target: Bare, drafts: list[int], qs: list[np.ndarray], pick: Pick,
              ) -> list[int]:
    """The drafts accepted, then the target's own token."""
    if pick.scale is None:
        accepted = 0
        while accepted < len(drafts) and target.argmax(accepted) == drafts[accepted]:
            accepted += 1
        return [*drafts[:accepted], target.argmax(accepted)]
    for i, (d, q) in enumerate(zip(drafts, qs)):
        p = pick.dist(target.row(i))
        p_d, q_d = p[d] / p.sum(dtype=np.float64), q[d] / q.sum(dtype=np.float64)
        if pick.rng.random() * q_d >= p_d:
            p, q = p / p.sum(dtype=np.float64), q / q.sum(dtype=np.float64)
            residual = np.maximum(p - q, 0.0)
            return [*drafts[:i], pick.draw(residual if residual.sum() > 0 else p)]
    return [*drafts, pick.draw(pick.dist(target.row(len(drafts))))]


@dataclass
class Pairing:
    """One repetition of a case: each loop's seconds after the prompt, those outside
    llama_decode, and its tokens and rounds."""

    ours_s: float
    bare_s: float
    ours_outside_s: float
    bare_outside_s: float
    ours_shape: tuple[int, int]
    bare_shape: tuple[int, int]

    def own(self, per: int) -> float:
        """Ours outside llama.cpp per token (per=0) or round (1), less the bare loop's:
        timed within each run, so a llama.cpp step that varies between runs does not
        move it."""
        return self.ours_outside_s / self.ours_shape[per] - \
            self.bare_outside_s / self.bare_shape[per]


def ours(dec: SpeculativeDecoder, prompt: list[int], n: int, k: int, temperature: float,
         seed: int) -> Any:
    return dec.generate(prompt, max_tokens=n,
                        sampling=SamplingParams(temperature=temperature, seed=seed),
                        draft_max=k, drafters="model" if k else (), draft_cache=False)


def one(dec: SpeculativeDecoder, bare: tuple[Bare, Bare], prompt: list[int], n: int, k: int,
        temperature: float, rep: int) -> Pairing:
    """Ours and the bare loop, in an order that alternates with `rep`. Greedy, they must
    give the same tokens with the same llama_decode calls on each model."""
    def bare_run() -> tuple[list[int], float, int]:
        pick = Pick(temperature, rep)
        return bare_self(*bare, prompt, n, k, pick) if k else \
            bare_alone(bare[0], prompt, n, pick)

    if rep % 2:
        tokens, bare_s, rounds = bare_run()
    calls = dec.target.decode_calls, dec.draft_model.decode_calls if dec.draft_model else 0
    result = ours(dec, prompt, n, k, temperature, rep)
    t_calls = dec.target.decode_calls - calls[0] - 1  # (its prompt's decode)
    d_calls = (dec.draft_model.decode_calls - calls[1] - 1) if dec.draft_model and k else 0
    if not rep % 2:
        tokens, bare_s, rounds = bare_run()
    if temperature == 0 and tokens != list(result.tokens):
        raise SystemExit(f"k={k}: the bare loop's tokens differ from specllama's")
    if temperature == 0 and (bare[0].calls, bare[1].calls if k else 0) != (t_calls, d_calls):
        raise SystemExit(f"k={k}: llama_decode calls differ: bare {bare[0].calls}, "
                         f"{bare[1].calls if k else 0}; specllama {t_calls}, {d_calls}")
    st = result.stats
    bare_decode_s = bare[0].decode_s + (bare[1].decode_s if k else 0.0)
    return Pairing(st.generate_s, bare_s, st.generate_s - st.target_s - st.draft_s,
                   bare_s - bare_decode_s, (st.tokens, st.target_steps), (len(tokens), rounds))


def items(dec: SpeculativeDecoder, prompt: list[int], k: int) -> None:
    """Each part of a round outside llama.cpp, timed alone on the target's real rows
    (best of 5 repeats of 200 calls: the least it costs)."""
    from harness.simulated import F32, outcome, state_for
    from specllama.engine.loop.rows import LazyP
    from specllama.engine.loop.stats import Stats
    from specllama.engine.sampling import probabilities, sample_logits_and_p, verify
    from specllama.policy import AutoDraftLength

    t = dec.target
    t.clear()
    t.decode(prompt[: k + 1], "all")
    rows = [np.array(t.logits_row(i)) for i in range(k + 1)]
    sampled, rng = SamplingParams(temperature=0.8), np.random.default_rng(0)
    qs = [probabilities(r, sampled) for r in rows[:k]]
    drafts = [int(np.argmax(q)) for q in qs]
    record = outcome(k, k, target_s=0.02, draft_s=0.01, seconds=0.03,
                     confidences=(0.9,) * k, draft_rows=k)
    policy, stats = AutoDraftLength(state_for(F32)), Stats()
    parts = {
        "a row's view of llama.cpp's logits": lambda: t.logits_row(0),
        "greedy: argmax of a row": lambda: np.argmax(rows[0]),
        "T = 0.8: p of a row (softmax, float64)": lambda: probabilities(rows[0], sampled),
        "T = 0.8: p(d) of a row, normalised lazily (LazyP)":
            lambda: LazyP(rows[0], sampled)[drafts[0]],
        "T = 0.8: a draw from a row": lambda: sample_logits_and_p(rows[0], sampled, rng),
        f"T = 0.8: the rule over k = {k} drafts (p rows given)":
            lambda: verify(lambda i: qs[min(i, k - 1)], drafts, list(qs), rng),
        "a copy of a row (penalties, ignore_eos)": lambda: np.array(rows[0]),
        "the round's record (RoundVerified)": lambda: outcome(k, k),
        "the stats' update": lambda: stats.record(record),
        "auto's update and choice": lambda: (policy.observe(record), policy.choose()),
    }
    print(f"{machine()}; {dec.target.path.name}: {dec.target.n_vocab} ids a row")
    for name, part in parts.items():
        best = min(timeit.repeat(part, number=200, repeat=5)) / 200
        print(f"{name:<52} {best * 1e6:8.1f} us")


def main() -> None:
    p = parser(__doc__)
    add_pair_options(p, pair="smollm2")
    add_run_options(p, reps=5, max_tokens=192, temperature=0.0)
    p.add_argument("--k", type=int, default=4, help="draft length of `self` (default: 4)")
    p.add_argument("--items", action="store_true", help="time each part of a round instead")
    args = p.parse_args()
    target, _ = resolve_models(args)
    dec = SpeculativeDecoder.load(target, target, n_ctx=N_CTX, n_threads=args.threads,
                                  p_min=0.0)
    bare = (Bare(target, args.threads), Bare(target, args.threads))
    prompt = dec.tokenize(PROMPT)
    if args.items:
        return items(dec, prompt, args.k)
    t = args.temperature
    n = min(args.max_tokens, len(ours(dec, prompt, args.max_tokens, 0, t, 0).tokens))
    for k in (0, args.k):  # untimed warm-up of both loops
        one(dec, bare, prompt, n, k, t, 0)
    print(f"{machine()}, {args.threads} threads; {target.name}; "
          f"{'greedy' if t == 0 else f'T = {t}'}, {n} tokens, {args.reps} repetitions")
    print(f"{'case':<10} {'bare/ours (wall)':>22} {'own us/token':>20} {'own us/round':>20}")
    for name, k in (("alone", 0), (f"self k={args.k}", args.k)):
        runs = [one(dec, bare, prompt, n, k, t, r) for r in range(args.reps)]
        ratio = Spread.of([r.bare_s / r.bare_shape[0] / (r.ours_s / r.ours_shape[0])
                           for r in runs])
        per_token = Spread.of([r.own(0) * 1e6 for r in runs])
        per_round = Spread.of([r.own(1) * 1e6 for r in runs])
        print(f"{name:<10} {ratio.slashed(3):>22} {per_token.slashed(0):>20} "
              f"{per_round.slashed(0):>20}")
    for b in bare:
        b.close()
    dec.close()


if __name__ == "__main__":
    run(main)
