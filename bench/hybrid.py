"""What hybrid models and MTP drafts cost on this machine: a recurrent state's
snapshots (memory per sequence, time per round), the target's verify curve T(k)/T(1),
the MTP step against a target step, and generation with MTP drafts against the target
alone (what auto chose, and the ratio).

Each figure is measured in one run on an idle machine, the repetitions interleaved: a
round is a verify pass of k + 1 tokens after the prompt, cut back to its first token
plus the accepted ones, as the round loop does. Synthetic models (random weights) time
what the real ones cost; their text is meaningless.

    python -m bench.hybrid --pair synth-qwen3.5-2b
    python -m bench.hybrid --pair synth-lfm2-1.2b --reps 7
    python -m bench.hybrid --pair synth-qwen3.5-9b --mtp-step-only
    python -m bench.hybrid --pair synth-qwen3.5-2b --generation-only --max-tokens 192 --reps 3
    python -m bench.hybrid --pair synth-qwen3.5-2b --rounds-only
"""

from __future__ import annotations

import json
import re
import statistics
import time

from bench.lib.common import (
    Spread,
    add_pair_options,
    add_run_options,
    machine,
    parser,
    resolve_models,
    run,
)
from specllama.engine.llama.rewind import SNAPSHOTS

PROMPT = "the quick brown fox jumps over the lazy dog " * 8
KS = (0, 1, 2, 3, 4, 5, 8)  # drafted tokens: a pass verifies k + 1
#: Rounds timed in a row: owed tokens ride along with the next passes and are decoded
#: alone once more than a pass holds, a cycle of a few rounds.
ROUNDS = 6


def recurrent_mib(lines: list[str]) -> float | None:
    """The recurrent state llama.cpp allocated (its log: "llama_memory_recurrent: size = X MiB")."""
    for line in reversed(lines):
        m = re.search(r"llama_memory_recurrent: size =\s*([\d.]+) MiB", line)
        if m:
            return float(m.group(1))
    return None


def load(target, threads: int, snapshots: int):
    """The target with `snapshots` per-token states, and the recurrent state llama.cpp
    allocated for it (the sequence and its spare)."""
    from specllama.engine.llama import Model
    from specllama.engine.llama.backend import recent_log

    model = Model(target, n_ctx=1024, n_threads=threads, snapshots=snapshots)
    return model, recurrent_mib(recent_log())


def round_seconds(model, prompt: list[int], k: int, accepted: int) -> float:
    """A verify pass of k + 1 tokens and the cut back, timed in steady state: a
    checkpoint copy leaves the kept tokens owed to the next pass, which decodes them."""
    model.truncate(len(prompt))
    model.settle()
    t0 = 0.0
    for i in range(ROUNDS + 1):  # the first leaves what a round before leaves; then timed
        t0 = time.perf_counter() if i == 1 else t0
        model.checkpoint(k + 1)
        model.decode(prompt[:k + 1], "all")  # any tokens: the cost does not depend on them
        model.truncate(len(model.cached) - k + accepted)
    return (time.perf_counter() - t0) / ROUNDS


def curves(models: dict, prompt: list[int], reps: int) -> dict:
    """T(k) per model (snapshots on / off), rounds interleaved across models and k."""
    times: dict = {name: {k: [] for k in KS} for name in models}
    for _ in range(reps):
        for k in KS:
            for name, m in models.items():
                times[name][k].append(round_seconds(m, prompt, k, k // 2))
    return {name: {k: statistics.median(v) for k, v in ts.items()} for name, ts in times.items()}


def mtp_step(model, reps: int) -> tuple[float, float] | None:
    """(target step, MTP step) in seconds, medians of single-token decodes."""
    from specllama.engine.llama.mtp import MtpDraft, has_mtp

    if not has_mtp(model):
        return None
    mtp = MtpDraft(model)
    try:
        tokens = model.tokenize(PROMPT)
        model.clear()
        model.decode(tokens, "none")
        mtp.decode(tokens, "none")
        target, draft = [], []
        for i in range(reps * 3):
            t0 = time.perf_counter()
            model.decode([tokens[i % len(tokens)]], "last")
            target.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            mtp.decode([tokens[i % len(tokens)]], "last")
            draft.append(time.perf_counter() - t0)
        return statistics.median(target), statistics.median(draft)
    finally:
        mtp.close()


def generation(target, threads: int, reps: int, max_tokens: int) -> dict:
    """Tokens per second with MTP drafts (auto and fixed lengths) against the target
    alone, greedy and at T = 0.8; fresh prompts each repetition (no cache to copy)."""
    from specllama import SamplingParams, SpeculativeDecoder

    dec = SpeculativeDecoder.load(target, n_ctx=1024, n_threads=threads)
    modes = {"alone": dict(draft_max=0), "mtp auto": dict(draft_max="auto", drafters=("mtp",)),
             "mtp k=1": dict(draft_max=1, drafters=("mtp",)),
             "mtp k=2": dict(draft_max=2, drafters=("mtp",)),
             "mtp k=3": dict(draft_max=3, drafters=("mtp",))}
    out: dict = {}
    try:
        if dec.draft is None:
            return {}
        for temp in (0.0, 0.8):
            rates: dict = {m: [] for m in modes}
            chosen: list[float] = []
            for rep in range(reps):
                prompt = f"{rep} {temp} {PROMPT}"
                for name, kw in modes.items():
                    s = SamplingParams(temperature=temp, seed=rep)
                    res = dec.generate(prompt, max_tokens=max_tokens, sampling=s, **kw)
                    rates[name].append(res.stats.tokens_per_s)
                    if name == "mtp auto":
                        chosen.append(res.stats.mean_draft_length)
            base = rates["alone"]
            out[str(temp)] = {
                "tok_s_alone": Spread.of(base).as_dict(),
                **{name: Spread.of([r / b for r, b in zip(v, base)]).as_dict()
                   for name, v in rates.items() if name != "alone"},
                "auto_mean_draft_length": statistics.median(chosen),
            }
    finally:
        dec.close()
    return out


def main() -> None:
    p = parser(__doc__)
    add_pair_options(p, pair="synth-qwen3.5-2b")
    add_run_options(p, reps=5, max_tokens=64, json=True)
    p.add_argument("--mtp-step-only", action="store_true",
                   help="only the MTP step against a target step (a 9B's curves take long)")
    p.add_argument("--generation-only", action="store_true",
                   help="only generation with MTP drafts against the target alone")
    p.add_argument("--rounds-only", action="store_true",
                   help="only a round's cost cut back by snapshot and by checkpoint copy")
    args = p.parse_args()
    target, _ = resolve_models(args)
    if args.generation_only:
        print(json.dumps({"machine": machine(), "target": str(target), "threads": args.threads,
                          "generation": generation(target, args.threads, args.reps,
                                                   args.max_tokens)}, indent=1))
        return
    if args.mtp_step_only:
        model, _ = load(target, args.threads, SNAPSHOTS)
        steps = mtp_step(model, args.reps)
        model.close()
        assert steps is not None, "this target has no MTP layers"
        print(json.dumps({"machine": machine(), "target": str(target), "threads": args.threads,
                          "target_step_ms": round(steps[0] * 1e3, 2),
                          "mtp_step_ms": round(steps[1] * 1e3, 2),
                          "mtp_step/target_step": round(steps[1] / steps[0], 3)}, indent=1))
        return
    with_snapshots, mib = load(target, args.threads, SNAPSHOTS)
    without, mib0 = load(target, args.threads, 0)
    prompt = with_snapshots.tokenize(PROMPT)
    for m in (with_snapshots, without):
        m.decode(prompt, "none")
    t = curves({"snapshots": with_snapshots, "copy": without}, prompt, args.reps * 3)
    steps = None if args.rounds_only else mtp_step(with_snapshots, args.reps)
    with_snapshots.close()
    without.close()
    gen = {} if args.rounds_only else generation(target, args.threads, args.reps,
                                                 args.max_tokens)
    report = {
        "machine": machine(), "target": str(target), "threads": args.threads,
        "memory": with_snapshots.memory_kind,
        "recurrent_state_mib": {f"n_rs_seq={SNAPSHOTS}": mib, "n_rs_seq=0": mib0},
        "round_ms": {name: {k: round(v * 1e3, 2) for k, v in ts.items()} for name, ts in t.items()},
        "T(k+1)/T(1)": {k: round(t["snapshots"][k] / t["snapshots"][0], 2) for k in KS},
        "copy/snapshot per round": {k: round(t["copy"][k] / t["snapshots"][k], 3) for k in KS},
        "mtp_step/target_step": None if steps is None else round(steps[1] / steps[0], 3),
        "target_step_ms": None if steps is None else round(steps[0] * 1e3, 2),
        "generation": gen,
    }
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    run(main)
