"""bench/soak.py's figures: what became of the requests, their latencies, memory over the
run and how each fault went, as a dict (`--json`) and as text."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from typing import Any

from bench.common import percentile
from bench.soak_requests import KINDS, Run


def spread(xs: list[float]) -> dict[str, float | None]:
    return {"n": len(xs), "p50": percentile(xs, 50), "p95": percentile(xs, 95)}


def rss(samples: list[dict[str, Any]], key: str) -> dict[str, float] | None:
    """MiB at the first sample, the most, and at the last (from KiB samples)."""
    xs = [s[key] / 1024 for s in samples if s.get(key)]
    return {"start": xs[0], "max": max(xs), "end": xs[-1]} if xs else None


def latencies(run: Run) -> dict[str, dict[str, float | None]]:
    done = [o for o in run.outcomes if o.kind == "completed"]
    return {"all": spread([o.seconds for o in done]),
            "plain": spread([o.seconds for o in done if not o.stream]),
            "stream": spread([o.seconds for o in done if o.stream]),
            "stream_first_token": spread([o.first_token_s for o in done
                                          if o.first_token_s is not None])}


def summarize(run: Run, final: dict[str, Any]) -> dict[str, Any]:
    outs = run.outcomes
    details = Counter(f"{o.kind}: {o.detail}" for o in outs
                      if o.kind not in ("completed", "dropped"))
    return {
        "requests": len(run.specs), "sent": run.issued, "answered": len(outs),
        "seconds": round(run.ended_s, 1),
        "outcomes": {k: sum(o.kind == k for o in outs) for k in KINDS},
        "details": dict(details.most_common()),
        "lost": [asdict(o) for o in outs if o.kind == "lost"],
        "latency_s": latencies(run),
        "rss_mib": {"serve": rss(run.samples, "serve_kib"),
                    "engine": rss(run.samples, "engine_kib")},
        "engine_pids": list(dict.fromkeys(s["engine_pid"] for s in run.samples
                                          if s["engine_pid"])),
        "health_errors": [s for s in run.samples if "error" in s],
        "faults": run.faults, **final,
        "samples": run.samples,
        "outcomes_by_request": [{**asdict(o), "words": len(run.specs[o.index].prompt.split()),
                                 "max_tokens": run.specs[o.index].max_tokens,
                                 "chat": run.specs[o.index].chat} for o in outs],
    }


def summary_lines(s: dict[str, Any]) -> list[str]:
    lines = [f"\n{s['sent']} of {s['requests']} requests sent, {s['answered']} answered, "
             f"in {s['seconds']:.0f} s"
             + (" (stopped: --max-minutes)" if s["sent"] < s["requests"] else "")
             + (f"; {s['clients_hung']} client(s) never returned" if s["clients_hung"] else "")]
    for kind, n in s["outcomes"].items():
        lines.append(f"  {kind:12} {n:6}{'   <- must be 0' if kind == 'lost' and n else ''}")
    lines += [f"    {n:5}  {what[:100]}" for what, n in s["details"].items()]
    lines.append("latency of completed requests (s)     n     p50     p95")
    for name, d in s["latency_s"].items():
        p50, p95 = (f"{d[k]:7.2f}" if d[k] is not None else "      -" for k in ("p50", "p95"))
        lines.append(f"  {name:32} {d['n']:5} {p50} {p95}")
    lines.append("RSS (MiB)      start     max     end")
    lines += [f"  {name:8} {d['start']:9.1f} {d['max']:7.1f} {d['end']:7.1f}"
              for name, d in s["rss_mib"].items() if d]
    lines.append(f"  engine processes seen: {len(s['engine_pids'])}; /health without an "
                 f"answer: {len(s['health_errors'])} of the samples")
    lines.append("faults: at s (request), kind; first /health 503 after s; serving again s "
                 "after the RPC server was back")
    lines += [f"  {f['at_s']:6.0f} ({f['at_request']:4}) {f['kind']:5} "
              f"{f['first_503_after_s']!s:>6} {f['serving_again_after_back_s']!s:>6}"
              for f in s["faults"]]
    lines.append(f"at the end: /health {s['final_health_status']} "
                 f"{json.dumps(s['final_requests'])}; serve exit status {s['serve_exit']}, "
                 f"engine left running: {s['engine_left']}; tracebacks in serve's log: "
                 f"{s['tracebacks']}")
    cache = s.get("final_prompt_cache")
    if cache:  # copies are of the engine process's life: a restart empties the cache
        lines.append(f"  prompt cache at the end: {cache['entries']} copies, "
                     f"{cache['bytes'] / 2**20:.0f} of {cache['limit_bytes'] / 2**20:.0f} MiB, "
                     f"{cache['hits']} hits")
    return lines
