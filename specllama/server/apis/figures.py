"""specllama's figures for one request: what speculation did, under one extra key of
every API's answer (standard clients ignore it; the `openai` client keeps it as
`model_extra["speculative"]`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ... import GenerationResult, Stats
from ...engine.drafting.chain import Drafters

EXTRA_KEY = "speculative"


def figures(
    result: GenerationResult, *, draft_max: int | str, drafters: Drafters,
    queue_s: float
) -> dict[str, Any]:
    """What speculation did for this request."""
    s = result.stats
    return {
        "target_steps": s.target_steps,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "acceptance_rate": round(s.acceptance_rate, 4),
        "acceptance_by_position": [round(a, 4) for a in s.acceptance_by_position],
        # tokens a response_format forced (drafted free of any model), apart from drafted
        "forced": s.forced,
        "forced_accepted": s.forced_accepted,
        "tokens_per_step": round(s.tokens_per_step, 4),
        "tokens_per_s": round(s.tokens_per_s, 2),
        "mean_draft_length": round(s.mean_draft_length, 3),
        # lookup drafts by where they were copied from: context, session, persisted, corpus
        "origin_drafted": dict(s.origin_drafted),
        "origin_accepted": dict(s.origin_accepted),
        # of those, tokens taken free inside model drafts from earlier replies followed
        "spliced": s.spliced,
        "spliced_accepted": s.spliced_accepted,
        "draft_max": draft_max,
        "drafters": list(drafters),
        "policy": s.policy_note,
        "finish_reason": result.finish_reason,
        "prompt_tokens_reused": s.prompt_reused,
        "queue_s": round(queue_s, 4),
        "prompt_s": round(s.prompt_s, 4),
        "generate_s": round(s.generate_s, 4),
        # The share of generate_s outside llama.cpp's decodes: specllama's own cost.
        "overhead_share": round(s.overhead_share, 4),
    }


def summed(results: Sequence[GenerationResult], first: dict[str, Any]) -> dict[str, Any]:
    """The figures of several choices of one request together: counts and times summed,
    rates of the sums, with `first`'s (a choice's figures) draft settings and queue time;
    no finish_reason: each choice has its own."""
    stats = Stats()
    for result in results:
        stats.merge(result.stats)
    stats.policy_note = results[-1].stats.policy_note  # (merge keeps none)
    body = figures(replace(results[0], stats=stats), draft_max=first["draft_max"],
                   drafters=first["drafters"], queue_s=first["queue_s"])
    del body["finish_reason"]
    return {**body, "choices": len(results)}
