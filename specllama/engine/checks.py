"""How often would this draft be accepted? Measured before anyone drafts with it:
`specllama pairs check` runs it on a few prompts.

Along the target's own greedy text, at each position: the draft's probability mass on
tokens it may propose (all of it for a pair that shares a tokenizer; the intersection for
a cross-vocabulary one), whether its likeliest allowed token is the target's (greedy
acceptance), and sum_x min(p(x), q(x)) at the given temperature: the chance a drafted
token is accepted there (Leviathan et al.'s alpha).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .crossvocab import CrossVocabDraft
from .decoder import SpeculativeDecoder
from .sampling import SamplingParams, probabilities


@dataclass(frozen=True)
class Agreement:
    positions: int
    mass_inside: float  # mean share of the draft's own softmax it may propose
    greedy: float  # P(its likeliest allowed token is the target's)
    alpha: float  # mean of sum_x min(p, q) at the temperature asked

    def expected_tokens(self, k: int, rate: float | None = None) -> float:
        """Tokens per round for k drafts at acceptance `rate` (alpha when None), as
        Leviathan et al.: (1 - a^(k+1)) / (1 - a)."""
        a = self.alpha if rate is None else rate
        return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def measure(decoder: SpeculativeDecoder, prompts: Sequence[Sequence[int]], n_tokens: int,
            params: SamplingParams) -> Agreement:
    """Walk the target's greedy continuation of each prompt, one token at a time, in both
    models. The caches are cleared first and left holding the last walk."""
    drafter = decoder.drafter
    if drafter is None:
        raise ValueError("this pair has no draft model")
    target = decoder.target
    inside, greedy, alpha = [], [], []
    for prompt in prompts:
        decoder.reset()
        tokens = list(prompt)
        target.decode(tokens, "last")
        drafter.decode(tokens, "last")
        for _ in range(n_tokens):
            p_logits = target.logits_row(-1)
            q_logits = drafter.logits_row(-1)
            best = int(np.argmax(p_logits))
            inside.append(_mass_inside(drafter, q_logits))
            greedy.append(float(int(np.argmax(q_logits)) == best))
            if not params.greedy:
                p = probabilities(p_logits, params)
                q = probabilities(q_logits, params)
                n = min(len(p), len(q))
                alpha.append(float(np.minimum(p[:n], q[:n]).sum()))
            if target.is_eog(best) or len(tokens) + 1 >= decoder.n_ctx:
                break
            tokens.append(best)
            target.decode([best], "last")
            drafter.sync_to(tokens[:-1])  # as a round's end: the next text is re-tokenized
            drafter.decode([best], "last")
    decoder.reset()
    n = len(greedy)
    mean = (lambda xs: float(np.mean(xs)) if xs else 0.0)  # noqa: E731
    return Agreement(n, mean(inside), mean(greedy), mean(alpha) if alpha else mean(greedy))


def _mass_inside(drafter: object, restricted: np.ndarray) -> float:
    """The share of the draft's own softmax on the tokens it may propose."""
    if not isinstance(drafter, CrossVocabDraft):
        return 1.0
    full = drafter.model.logits_row(-1).astype(np.float64)
    weights = np.exp(full - full.max())
    return float(weights[drafter.vmap.draft_ids].sum() / weights.sum())
