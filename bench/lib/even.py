"""llama-server given `specllama serve`'s settings where its defaults differ in what a
request costs (bench/llamaserver.py): our batch, a full sliding-window cache, no prompt
checkpoints, our plain chat format for a model without a chat template, and our sampler
chain. A lead that comes from an uneven setting is not a lead."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from specllama.engine.llama.gguf import has_key

#: Our batch, logical and physical alike: Model's n_batch, cut to n_ctx (engine/llama/
#: model.py), is both n_batch and n_ubatch of its context (engine/llama/context.py).
OUR_N_BATCH = 512
#: The chat format `specllama serve` uses for a model without a chat template
#: (server/prompts.py, `_plain`, and its stop string PLAIN_STOP), as a Jinja template.
PLAIN_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}{{ message.content + '\\n\\n' }}"
    "{%- elif message.role == 'user' -%}{{ 'User: ' + message.content + '\\n' }}"
    "{%- else -%}{{ 'Assistant: ' + message.content + '\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'Assistant:' }}{%- endif -%}")
PLAIN_STOP = "\nUser:"


def even_flags(args: argparse.Namespace, target: Path) -> list[str]:
    """llama-server's settings where its defaults differ from `specllama serve`'s in what
    a request costs (-c, -np 1, -t and -tb are set above; flash attention, the KV cache's
    types, mmap and the threads' polling are the same defaults of the same llama.cpp)."""
    n_batch = str(min(OUR_N_BATCH, args.n_ctx))
    flags = [
        # our batch: 512 tokens per llama_decode and per ubatch (llama-server: -b 2048 -ub 512)
        "-b", n_batch, "-ub", n_batch,
        # our sliding-window cache keeps every cell (context.py: swa_full); llama-server's
        # keeps the window, which also makes it checkpoint every prompt (next flag)
        "--swa-full",
        # ours takes no prompt checkpoints: llama-server cuts each prompt of an SWA or
        # recurrent model into extra batches (at the user turn, 4 and 4 + n_ubatch tokens
        # before its end) and copies the state there, for a later request sharing the
        # prefix, which `fresh` prompts never are
        "--ctx-checkpoints", "0",
    ]
    if has_chat_template(target) is False:
        # ours chats in 'User: ... Assistant:' (server/prompts.py) where llama-server
        # falls back to ChatML: ~30 more prompt tokens a request on a byte-level vocabulary
        path = Path(tempfile.mkdtemp(prefix="template-")) / "plain.jinja"
        path.write_text(PLAIN_TEMPLATE)
        flags += ["--chat-template-file", str(path)]
    return flags


def has_chat_template(path: Path) -> bool | None:
    """Whether the GGUF's header holds a tokenizer.chat_template (None: no GGUF header
    this could read through)."""
    return has_key(path, "tokenizer.chat_template")


def sampler_fields(temp: float) -> dict[str, Any]:
    """Our sampler chain in a llama-server request. llama-server runs its default chain
    (penalties, DRY, top-n-sigma, top-k, typical, top-p, min-p, XTC, temperature) and
    then draws with a softmax over the whole vocabulary, at T = 0 too: a few passes over
    every logit per token, where ours takes the argmax at T = 0 (engine/sampling.py) and
    at T > 0 scales, exponentiates and draws once (top-k, top-p and min-p off in both)."""
    if temp == 0:
        return {"samplers": ["top_k"], "top_k": 1}  # argmax: one candidate left to draw
    return {"samplers": ["temperature"]}
