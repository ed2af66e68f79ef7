"""bench/soak.py's figures: what became of the requests, their latencies, memory over the
run and how each fault went, as a dict (`--json`) and as text."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import asdict
from typing import Any

from bench.lib.common import percentile
from bench.lib.soak_requests import KINDS, Run


def spread(xs: list[float]) -> dict[str, float | None]:
    return {"n": len(xs), "p50": percentile(xs, 50), "p95": percentile(xs, 95)}


def rss(samples: list[dict[str, Any]], key: str,
        growth_mib: float = 64, cache: bool = False) -> dict[str, Any] | None:
    """MiB at the first sample, the most, and at the last (from KiB samples); and whether
    it is bounded: the median of the last tenth of the samples (`last`) at most
    `growth_mib` over that of the tenth after the first fifth, the warm-up (`warm`).
    cache: judge the growth without the prompt cache's copies of the same sample (the
    engine's; they fill to their own limit and empty at each restart)."""
    xs = [s[key] / 1024 for s in samples if s.get(key)]
    if not xs:
        return None
    bare = [s[key] / 1024 - (s.get("cache_bytes") or 0) / 2**20 if cache else s[key] / 1024
            for s in samples if s.get(key)]
    k, w = max(1, len(xs) // 10), len(xs) // 5
    warm, last = statistics.median(bare[w:w + k]), statistics.median(bare[-k:])
    return {"start": xs[0], "max": max(xs), "end": xs[-1], "warm": warm, "last": last,
            "growth": last - warm, "bounded": last - warm <= growth_mib,
            "less_cache": cache}


def prompt_cache(samples: list[dict[str, Any]], final: dict[str, Any]) -> dict[str, Any]:
    """The prompt cache's bytes against its limit at every sample and at the end."""
    pairs = [(s["cache_bytes"], s["cache_limit"]) for s in samples
             if s.get("cache_bytes") is not None and s.get("cache_limit") is not None]
    end = final.get("final_prompt_cache")
    if end:
        pairs.append((end["bytes"], end["limit_bytes"]))
    over = [b for b, limit in pairs if b > limit]
    return {"readings": len(pairs), "max_bytes": max((b for b, _ in pairs), default=None),
            "limit_bytes": max((limit for _, limit in pairs), default=None),
            "over_limit": len(over), "within_limit": bool(pairs) and not over}


def latencies(run: Run) -> dict[str, dict[str, float | None]]:
    done = [o for o in run.outcomes if o.kind == "completed"]
    return {"all": spread([o.seconds for o in done]),
            "plain": spread([o.seconds for o in done if not o.stream]),
            "stream": spread([o.seconds for o in done if o.stream]),
            "stream_first_token": spread([o.first_token_s for o in done
                                          if o.first_token_s is not None])}


def summarize(run: Run, final: dict[str, Any], rss_growth_mib: float = 64) -> dict[str, Any]:
    outs = run.outcomes
    lost = sum(o.kind == "lost" for o in outs) + run.issued - len(outs)
    memory = {"serve": rss(run.samples, "serve_kib", rss_growth_mib),
              "engine": rss(run.samples, "engine_kib", rss_growth_mib, cache=True)}
    cache = prompt_cache(run.samples, final)
    idle = (final.get("final_health_status") == 200 and final.get("final_busy") is False
            and final.get("final_serving") == 0)
    details = Counter(f"{o.kind}: {o.detail}" for o in outs
                      if o.kind not in ("completed", "dropped"))
    return {
        "requests": len(run.specs), "sent": run.issued, "answered": len(outs),
        "seconds": round(run.ended_s, 1),
        "outcomes": {k: sum(o.kind == k for o in outs) for k in KINDS},
        "abandon_planned": sum(s.drop_after > 0 for s in run.specs[:run.issued]),
        "requests_lost": lost,  # lost outcomes, and requests sent that never got one
        "checks": {"none_lost": lost == 0 and not final.get("clients_hung"),
                   "rss_bounded": all(d["bounded"] for d in memory.values() if d),
                   "cache_within_limit": cache["within_limit"], "idle_at_end": idle},
        "details": dict(details.most_common()),
        "lost": [asdict(o) for o in outs if o.kind == "lost"],
        "latency_s": latencies(run),
        "rss_mib": memory, "rss_growth_limit_mib": rss_growth_mib,
        "prompt_cache": cache,
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
    lines.append(f"  requests lost (no status): {s['requests_lost']}; streams abandoned on "
                 f"purpose: {s['outcomes']['dropped']} of {s['abandon_planned']} planned "
                 "(the others ended first)")
    lines += [f"    {n:5}  {what[:100]}" for what, n in s["details"].items()]
    lines.append("latency of completed requests (s)     n     p50     p95")
    for name, d in s["latency_s"].items():
        p50, p95 = (f"{d[k]:7.2f}" if d[k] is not None else "      -" for k in ("p50", "p95"))
        lines.append(f"  {name:32} {d['n']:5} {p50} {p95}")
    lines.append("RSS (MiB)      start     max     end    warm    last  growth  bounded")
    lines += [f"  {name:8} {d['start']:9.1f} {d['max']:7.1f} {d['end']:7.1f} "
              f"{d['warm']:7.1f} {d['last']:7.1f} {d['growth']:+7.1f}  {d['bounded']}"
              for name, d in s["rss_mib"].items() if d]
    lines.append(f"  engine processes seen: {len(s['engine_pids'])}; /health without an "
                 f"answer: {len(s['health_errors'])} of the samples")
    lines.append("faults: at s (request), kind; first /health 503 after s; serving again s "
                 "after the RPC server was back (engine: after the kill)")
    lines += [f"  {f['at_s']:6.0f} ({f['at_request']:4}) {f['kind']:6} "
              f"{f['first_503_after_s']!s:>6} {f['serving_again_after_back_s']!s:>6}"
              + (f"  ({f['serving_at_kill']} in flight)" if f["kind"] == "engine" else "")
              + (f"  {f['error']}" if f.get("error") else "")
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
    pc = s["prompt_cache"]
    if pc["readings"]:
        lines.append(f"  prompt cache at most {pc['max_bytes'] / 2**20:.1f} of "
                     f"{pc['limit_bytes'] / 2**20:.0f} MiB over {pc['readings']} readings; "
                     f"over its limit: {pc['over_limit']}")
    lines.append(f"  busy {s.get('final_busy')}, serving {s.get('final_serving')}, waiting "
                 f"{s.get('final_waiting')} (settled in {s.get('settled_after_s')} s)")
    lines.append("checks: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}"
                                        for k, v in s["checks"].items()))
    return lines
