"""`specllama serve` beside `llama-server`, at the request level, through the OpenAI API.

Both servers run the same llama.cpp: `llama-server` is built from `vendor/llama.cpp` of
the installed llama-cpp-python's sdist (bench/lib/llamacpp_build.py builds it once into the user
cache). Every server is up at once (an idle one uses no CPU; never two requests at
once) and answers one untimed warm-up request; then every prompt at every temperature
goes to each server in turn as a chat completion (a plain completion for a prompt
marked `"chat": false`) with the same seed, max_tokens and
sampling (top-k, top-p and min-p off on both sides, so T = 0.8 is the same
distribution), timed at the client from the POST to the last byte. Each prompt carries
a tag naming its repetition and temperature, so no server has seen it before (see
`fresh`), and every server starts afresh for each repetition, so none drafts from the
answers of the last. Figures: tokens per second of each request (completion tokens over
that time), their geometric mean over the prompts per repetition, then min/median/max over
repetitions; ratios are taken within a repetition. Each server's own draft/accept
counts come from its response (`timings` for llama-server, `speculative` for ours).

llama-server runs with our settings where its defaults differ in what a request costs
(`even_flags`, `sampler_fields`): our batch, a full sliding-window cache, no prompt
checkpoints, our plain chat format for a model without a chat template, and our sampler
chain (argmax at T = 0, temperature alone otherwise) rather than its default chain, whose
final softmax over the whole vocabulary costs ~3 ms a token on a 262k vocabulary.
`--llama-server-defaults` leaves llama-server its own, to see what they cost it.

    python -m bench.llamaserver --pair smollm2-f32
    python -m bench.llamaserver --pair smollm2 --reps 5 --n-max 2,3 --p-min 0.75
    python -m bench.llamaserver --pair smollm2-f32 --stream --specllama "default;--draft-max 0"
    python -m bench.llamaserver --pair synth-qwen3.5-2b --mtp 1,2,3 \
        --specllama "--draft-max 0;--drafters mtp"
    python -m bench.llamaserver --pair synth-llama3.1-8b-eagle3 --eagle3 2,3,4 \
        --specllama "--draft-max 0;default;--drafters model"

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.lib.common import (
    SPECLLAMA,
    add_run_options,
    geomean,
    model_flags,
    parser,
    run,
)
from bench.lib.even import PLAIN_STOP, even_flags, sampler_fields
from bench.lib.llamacpp_build import (
    add_comparison_options,
    comparison_prompts,
    ngram_cache_flags,
    numbers,
    pair_and_tools,
)
from bench.lib.processes import ApiServer, body, request
from bench.lib.server_table import BASELINE, Contender, print_table, summarize
from specllama.engine.llama.gguf import architecture

# ------------------------------------------------------------------------------ contenders


def contenders(args: argparse.Namespace, target: Path,
               draft: Path | None) -> list[Contender]:
    return [*llama_contenders(args, target, draft), *specllama_contenders(args)]


def llama_contenders(args: argparse.Namespace, target: Path,
                     draft: Path | None) -> list[Contender]:
    """llama-server alone, with a draft model for each setting of the sweep, with the
    target's MTP layers or a Gemma 4 assistant draft (--mtp), and with each --ngram
    spec type."""
    exe, t = str(args.bins["llama-server"]), str(args.threads)
    even = [] if args.llama_server_defaults else even_flags(args, target)
    common = [exe, "-m", str(target), "-t", t, "-tb", t, "-c", str(args.n_ctx), "-np", "1",
              *even, "--no-webui", "--host", "127.0.0.1"]
    md = [] if draft is None else ["-md", str(draft), "-td", t, "-tbd", t]
    stop = (PLAIN_STOP,) if "--chat-template-file" in even else ()
    out = [Contender(BASELINE, common, "--port", "llama-server")]
    # draft-mtp drafts with the target's MTP layers, or with a Gemma 4 assistant (-md)
    assistant = md if draft is not None and architecture(draft) == "gemma4-assistant" else []
    for n_max in numbers(args.mtp, int) if args.mtp else []:
        out.append(Contender(f"llama-server draft-mtp n-max {n_max}",
                             [*common, *assistant, "--spec-type", "draft-mtp",
                              "--spec-draft-n-max", str(n_max)], "--port", "llama-server"))
    # draft-eagle3: an EAGLE3 head (-md) fusing three of the target's layers
    for n_max in numbers(args.eagle3, int) if args.eagle3 else []:
        for p_min in numbers(args.p_min):
            out.append(Contender(f"llama-server draft-eagle3 n-max {n_max} p-min {p_min:g}",
                                 [*common, *md, "--spec-type", "draft-eagle3",
                                  "--spec-draft-n-max", str(n_max),
                                  "--spec-draft-p-min", str(p_min)], "--port", "llama-server"))
    plain = draft is not None and not args.eagle3  # (an EAGLE3 head is no draft-simple)
    for n_max in numbers(args.n_max, int) if plain else []:
        for n_min in numbers(args.n_min, int):
            for p_min in numbers(args.p_min):
                out.append(Contender(
                    f"llama-server -md n-max {n_max} n-min {n_min} p-min {p_min:g}",
                    [*common, *md, "--spec-type", "draft-simple",
                     "--spec-draft-n-max", str(n_max), "--spec-draft-n-min", str(n_min),
                     "--spec-draft-p-min", str(p_min)], "--port", "llama-server"))
    for spec_type in filter(None, args.ngram.split(",")):
        with_draft = spec_type.startswith("draft+")
        name = spec_type.removeprefix("draft+")
        out.append(Contender(
            f"llama-server {'-md + ' if with_draft else ''}{name}",
            [*common, *(md if with_draft else []),
             "--spec-type", f"draft-simple,{name}" if with_draft else name,
             *ngram_cache_flags(args, target, name)],
            "--port", "llama-server"))
    for c in out:
        c.our_sampling, c.stop = not args.llama_server_defaults, stop
    return out


def specllama_contenders(args: argparse.Namespace) -> list[Contender]:
    """`specllama serve` with each ';'-separated flag set of --specllama."""
    out = []
    for flags in args.specllama.split(";"):
        flags = flags.strip()
        extra = [] if flags in ("", "default") else shlex.split(flags)
        out.append(Contender(
            f"specllama {flags or 'default'}",
            [*SPECLLAMA, "serve", *model_flags(args), "--threads", str(args.threads),
             "--n-ctx", str(args.n_ctx), *[f"--corpus={p}" for p in args.corpus], *extra],
            "--port", "specllama"))
    if args.prediction:  # each again, sent the prompts' predictions
        out += [replace(c, name=c.name + " +prediction", predict=True, runs={}) for c in out]
    return out


def fresh(prompt: str, rep: int, temp: float) -> str:
    """The prompt as no server has seen it: llama-server keeps earlier prompts' KV in RAM
    (`--cache-ram`, 8 GiB by default) and would evaluate a repeated one for free from the
    second repetition on, ours only reuses the previous request's prefix. A tag in front
    leaves both only the chat template's preamble to reuse, as for a new request."""
    return f"(request {rep + 1}-{temp:g})\n{prompt}"


def request_body(c: Contender, model: str, prompt: str, temp: float, seed: int,
                 max_tokens: int, stream: bool, chat: bool,
                 prediction: str | None = None) -> dict[str, Any]:
    """The request's body: the same for every server (processes.body), and for
    llama-server our sampler chain and the stop strings our chat format adds."""
    b = body(model, prompt, temp, seed, max_tokens, stream, chat)
    if c.predict and prediction is not None:
        b["prediction"] = {"type": "content", "content": prediction}
    if c.our_sampling:
        b.update(sampler_fields(temp))
        if chat and c.stop:
            b["stop"] = list(c.stop)
    return b


def record(c: Contender, answer: dict[str, Any], seconds: float) -> dict[str, Any]:
    usage = answer.get("usage") or {}
    n = int(usage.get("completion_tokens", 0))
    r: dict[str, Any] = {"tokens": n, "prompt_tokens": usage.get("prompt_tokens"),
                         "seconds": seconds, "tokens_per_s": n / seconds}
    if c.kind == "llama-server":
        timings = answer.get("timings") or {}
        r["drafted"] = int(timings.get("draft_n", 0))
        r["accepted"] = int(timings.get("draft_n_accepted", 0))
        r["server_tokens_per_s"] = timings.get("predicted_per_second")
    else:
        spec = answer.get("speculative") or {}
        r["drafted"] = int(spec.get("drafted", 0))
        r["accepted"] = int(spec.get("accepted", 0))
        r["server_tokens_per_s"] = spec.get("tokens_per_s")
        r["policy"] = spec.get("policy")  # auto's one line: why it drafted as it did
        details = usage.get("completion_tokens_details") or {}
        r["prediction_accepted"] = details.get("accepted_prediction_tokens")
        r["prediction_rejected"] = details.get("rejected_prediction_tokens")
    return r


#: The warm-up's prompt: no benchmark prompt's text, so that no server (ours remember
#: what they generated, llama-server's n-gram drafts too) drafts a timed answer from it.
WARM_UP = "Say hello."


def start_all(cs: list[Contender], args: argparse.Namespace, chat: bool,
              servers: dict[str, ApiServer]) -> None:
    """Every server up at once (an idle one uses no CPU), each warmed by one request."""
    for c in cs:
        server = servers[c.name] = ApiServer(c.name, c.argv, c.port_flag, args.timeout,
                                               args.logs)
        status, answer, _ = request(
            server.port, "/v1/chat/completions" if chat else "/v1/completions",
            request_body(c, server.model, WARM_UP, 0.0, 0, 8, False, chat), args.timeout)
        if status != 200:
            sys.exit(f"{c.name}: warm-up answered {status}: {answer}")


def stop_all(servers: dict[str, ApiServer]) -> None:
    for server in servers.values():
        server.stop()
    servers.clear()


def send(server: ApiServer, c: Contender, args: argparse.Namespace, p: Any, rep: int,
         temp: float, seed: int) -> dict[str, Any]:
    status, answer, seconds = request(
        server.port, "/v1/chat/completions" if p.chat else "/v1/completions",
        request_body(c, server.model, fresh(p.prompt, rep, temp), temp, seed,
                     args.max_tokens, args.stream, p.chat, p.prediction),
        args.timeout, stream=args.stream)
    if status != 200:
        sys.exit(f"{c.name}: {p.id} answered {status}: {answer}")
    r = record(c, answer, seconds)
    r.update(prompt=p.id, seed=seed)
    return r


def run_all(cs: list[Contender], args: argparse.Namespace, prompts: list[Any]) -> None:
    """Each request sent to each server in turn, the order rotated from one prompt to the
    next: the machine's drift (this VM's memory bandwidth swings ±15% over minutes)
    falls on every contender alike. Every server starts afresh for each repetition: a
    server that drafts from what it generated before (ours, llama-server's n-gram kinds)
    would otherwise copy the last repetition's answers to the same prompts, which
    measures its cache, not the pair."""
    servers: dict[str, ApiServer] = {}
    try:
        turn = 0
        for rep in range(args.reps):
            stop_all(servers)
            start_all(cs, args, prompts[0].chat, servers)
            for temp in args.temps:
                rows: dict[str, list[dict[str, Any]]] = {c.name: [] for c in cs}
                for i, p in enumerate(prompts):
                    shift, turn = turn % len(cs), turn + 1
                    for c in cs[shift:] + cs[:shift]:
                        rows[c.name].append(send(servers[c.name], c, args, p, rep, temp,
                                                 args.seed + 1000 * rep + i))
                for c in cs:
                    c.runs.setdefault(temp, []).append(rows[c.name])
                    gm = geomean([r["tokens_per_s"] for r in rows[c.name]])
                    print(f"  rep {rep + 1} T={temp:g} {c.name}: {gm:.1f} tok/s", file=sys.stderr)
    finally:
        stop_all(servers)


def arguments() -> argparse.ArgumentParser:
    p = parser(__doc__)
    add_comparison_options(p)
    add_run_options(p, reps=5, max_tokens=128)
    p.add_argument("--n-max", default="2,3,4", help="llama-server --spec-draft-n-max sweep")
    p.add_argument("--n-min", default="0", help="llama-server --spec-draft-n-min sweep")
    p.add_argument("--p-min", default="0,0.75", help="llama-server --spec-draft-p-min sweep")
    p.add_argument("--mtp", default="",
                   help="llama-server --spec-type draft-mtp with each --spec-draft-n-max "
                        "of this list (a target with MTP layers; no draft file needed)")
    p.add_argument("--eagle3", default="",
                   help="llama-server --spec-type draft-eagle3 (the --draft file is an EAGLE3 "
                        "head) with each --spec-draft-n-max of this list, and each --p-min")
    p.add_argument("--ngram", default="",
                   help="llama-server --spec-type values to add, comma-separated "
                        "(prefix 'draft+' to keep -md too), e.g. ngram-mod,draft+ngram-mod")
    p.add_argument("--specllama", default="--draft-max 0;default;--drafters model",
                   help="specllama serve flag sets, ';'-separated ('default': none)")
    p.add_argument("--prediction", action="store_true",
                   help="each specllama flag set again, sent each prompt's 'prediction' "
                        "(Predicted Outputs; e.g. --prompts bench/prompts/edit-file.jsonl)")
    p.add_argument("--stream", action="store_true", help="streamed requests (SSE)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per request/start")
    p.add_argument("--logs", type=Path, help="keep each server's log in this folder")
    p.add_argument("--llama-server-defaults", action="store_true",
                   help="run llama-server with its own defaults where they differ from ours "
                        "(batch, SWA cache, prompt checkpoints, ChatML for a model without a "
                        "chat template, its default sampler chain): what the comparison was "
                        "before these were evened")
    p.add_argument("--corpus", type=Path, nargs="+", default=[],
                   help="files or folders: `--corpus` for our servers, a static cache "
                        "(-lcs, built by llama-lookup-create) for llama-server's ngram-cache")
    return p


def main() -> None:
    args = arguments().parse_args()
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    version, target, draft, args.bins = pair_and_tools(args)
    args.temps = numbers(args.temperatures)
    prompts = comparison_prompts(args)
    cs = contenders(args, target, draft)
    run_all(cs, args, prompts)
    print(f"target {target}\ndraft {draft}\nthreads {args.threads}, max tokens "
          f"{args.max_tokens}, {len(prompts)} prompts, reps {args.reps}, "
          f"{'streamed' if args.stream else 'non-streamed'} requests; "
          "tok/s: geometric mean over prompts of each request's tokens / its time at the client")
    summary = {str(t): summarize(cs, t) for t in args.temps}
    for t in args.temps:
        print_table(t, summary[str(t)])
    if args.json:
        args.json.write_text(json.dumps({
            "llama_cpp_python": version, "target": str(target), "draft": str(draft),
            "args": {k: v for k, v in vars(args).items() if k != "bins"},
            "summary": summary,
            "runs": {c.name: {str(t): reps for t, reps in c.runs.items()} for c in cs},
        }, indent=1, default=str))


if __name__ == "__main__":
    run(main)
