"""How often would this draft be accepted? Measured before anyone drafts with it:
`specllama pairs check` runs it on a few prompts.

Along the target's own greedy text, at each position: the draft's probability mass on
tokens it may propose (all of it for a pair that shares a tokenizer; the intersection for
a cross-vocabulary one), whether its likeliest allowed token is the target's (greedy
acceptance), and sum_x min(p(x), q(x)) at the given temperature: the chance a drafted
token is accepted there (Leviathan et al.'s alpha).

And whether the target is batch-invariant here: verifying reads a draft's rows from one
batched decode, the target alone reads each from a single-token one. Where the two kernels
pick different argmaxes (a quantized target, near-ties), greedy speculative output can part
from the target alone's, each still the target's own choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
    drafter = decoder.draft_model
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
            inside.append(drafter.own_mass())
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


@dataclass(frozen=True)
class BatchInvariance:
    positions: int
    agree: int  # positions whose argmax is the same token both ways
    first_part: int | None  # the first position where it is not
    max_diff: float  # largest absolute logit difference over every row

    @property
    def invariant(self) -> bool:
        return self.agree == self.positions

    def describe(self) -> str:
        diff = f"max logit difference {self.max_diff:.2g}"
        if self.invariant:
            return (f"batched and single-token decodes agree (argmax at {self.agree}/"
                    f"{self.positions} positions, {diff})")
        return (f"batched and single-token decodes part: the argmax differs at "
                f"{self.positions - self.agree} of {self.positions} positions, first at "
                f"position {(self.first_part or 0) + 1} ({diff}); greedy output may then "
                f"differ from the target alone's, while staying the target's own distribution")


def batch_invariance(decoder: SpeculativeDecoder, prompt: Sequence[int],
                     n_tokens: int) -> BatchInvariance:
    """Decode the target's greedy continuation of `prompt` one token at a time, then the
    same tokens again in one batch, and compare the rows they give. The caches are
    cleared first and after."""
    target = decoder.target
    decoder.reset()
    target.decode(list(prompt), "last")
    fed = [int(np.argmax(target.logits_row(-1)))]
    single: list[np.ndarray] = []
    limit = min(n_tokens, target.n_batch, decoder.n_ctx - len(prompt) - 1)
    while len(single) < limit and not target.is_eog(fed[-1]):
        target.decode([fed[-1]], "last")
        single.append(target.logits_row(-1).copy())
        fed.append(int(np.argmax(single[-1])))
    fed = fed[: len(single)]
    target.truncate(len(prompt))
    target.decode(fed, "all")
    parts, max_diff = [], 0.0
    for i, row in enumerate(single):
        batched = target.logits_row(i)
        max_diff = max(max_diff, float(np.abs(batched - row).max()))
        if int(np.argmax(batched)) != int(np.argmax(row)):
            parts.append(i)
    decoder.reset()
    n = len(single)
    return BatchInvariance(n, n - len(parts), parts[0] if parts else None, max_diff)
