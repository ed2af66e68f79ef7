"""llama.cpp's own tools, built from the sources specllama runs on, for the side-by-side
scripts (bench/llamacpp.py, bench/llamaserver.py), and the options both take."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from bench.lib.common import add_pair_options, resolve_models

TOOLS = ("llama-speculative-simple", "llama-bench", "llama-server", "llama-lookup-create")


def pair_and_tools(args: argparse.Namespace) -> tuple[str, Path, Path | None, dict[str, Path]]:
    """The installed llama-cpp-python's version, the pair's two files (resolved first: a
    wrong pair fails before a build) and llama.cpp's tools of that version."""
    import importlib.metadata

    version = importlib.metadata.version("llama_cpp_python")
    # --mtp: the target drafts for itself, no draft file
    target, draft = resolve_models(args, need_draft=not getattr(args, "mtp", ""))
    return version, target, draft, build_tools(version, args.sdist)


def build_tools(version: str, sdist: Path | None) -> dict[str, Path]:
    """The tools, built from `vendor/llama.cpp` of the llama-cpp-python sdist of
    `version` (downloaded unless `sdist` is given) into `<user cache dir>/specllama/
    llamacpp-<version>/`; reused when already built."""
    from specllama.paths import cache_dir

    root = cache_dir() / f"llamacpp-{version}"
    src, build = root / "src", root / "build"
    bins = {name: build / "bin" / name for name in TOOLS}
    if all(p.exists() for p in bins.values()):
        return bins
    if not (src / "CMakeLists.txt").exists():
        unpack_sources(version, sdist, src)
    print(f"building {', '.join(TOOLS)} in {build} (several minutes)", file=sys.stderr)
    # GGML_NATIVE as llama-cpp-python builds by default; LLAMA_CURL is gone in this
    # llama.cpp (deprecated, ignored): LLAMA_OPENSSL=OFF is what keeps it off the network.
    subprocess.run(["nice", "cmake", "-S", str(src), "-B", str(build),
                    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_OPENSSL=OFF",
                    *no_amx_flags()],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["nice", "cmake", "--build", str(build), "--target", *TOOLS, "-j", "2"],
                   check=True, stdout=subprocess.DEVNULL)
    return bins


def unpack_sources(version: str, sdist: Path | None, src: Path) -> None:
    """`vendor/llama.cpp` of the sdist into `src` (the sdist downloaded by pip if None)."""
    with tempfile.TemporaryDirectory(prefix="specllama-sdist-") as tmp:
        if sdist is None:
            subprocess.run([sys.executable, "-m", "pip", "download",
                            f"llama-cpp-python=={version}", "--no-binary", ":all:",
                            "--no-deps", "-d", tmp], check=True)
            sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            if not members:
                sys.exit(f"{sdist}: no {prefix} in it (not the sdist of {version}?)")
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(src, members=[m for m in members if m.name], filter="data")


def no_amx_flags(cpuinfo: str | None = None) -> list[str]:
    """On a CPU with AMX, build without llama.cpp's AMX kernels: built by GCC 12 they crash
    on any batch of quantized tokens (llama.cpp issue 20824), which is why specllama loads
    models without extra buffer types on such a build (engine/llama/backend.py). GCC keeps
    an explicit -mno-* against -march=native, whatever their order."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    if " amx_int8" not in cpuinfo:
        return []
    off = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    return [f"-DCMAKE_C_FLAGS={off}", f"-DCMAKE_CXX_FLAGS={off}"]


def ngram_cache_flags(args: argparse.Namespace, target: Path, name: str) -> list[str]:
    """ngram-cache keeps what it learns across requests only in a dynamic cache file
    (-lcd), as our suffix cache keeps earlier outputs: one, fresh per run. With --corpus
    it also gets a static cache file (-lcs) built from the same text."""
    if name != "ngram-cache":
        return []
    path = Path(tempfile.mkdtemp(prefix="lcd-")) / "dynamic.bin"
    path.touch()  # llama-server aborts if the file is missing: an empty one
    flags = ["-lcd", str(path)]
    if args.corpus:
        flags += ["-lcs", str(static_cache(args.bins["llama-lookup-create"], target,
                                           args.corpus, args.threads,
                                           path.parent / "static.bin"))]
    return flags


def static_cache(tool: Path, target: Path, corpus: list[Path], threads: int,
                 out: Path) -> Path:
    """llama.cpp's static n-gram cache of the corpus, as `llama-lookup-create` (`tool`)
    builds it from one text: the UTF-8 text files under each path (hidden entries
    skipped, sorted), joined by blank lines, as `specllama serve --corpus` reads them."""
    texts = corpus_texts(corpus)
    text = out.with_suffix(".txt")
    text.write_text("\n\n".join(texts), encoding="utf-8")
    subprocess.run([str(tool), "-m", str(target), "-f", str(text), "-lcs", str(out),
                    "-t", str(threads)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"llama-lookup-create: {len(texts)} files, {text.stat().st_size} bytes -> {out}",
          file=sys.stderr)
    return out


def corpus_texts(corpus: list[Path]) -> list[str]:
    texts = []
    for root in corpus:
        files = [root] if root.is_file() else sorted(
            f for f in root.rglob("*")
            if f.is_file() and not any(part.startswith(".") for part in f.relative_to(root).parts))
        for f in files:
            try:
                data = f.read_bytes()
                if b"\0" not in data[:8192]:
                    texts.append(data.decode("utf-8"))
            except (OSError, UnicodeDecodeError):
                continue
    return texts


def add_comparison_options(p: argparse.ArgumentParser) -> None:
    """The pair, the llama.cpp sources, the prompts and temperatures: what both
    side-by-side scripts take."""
    add_pair_options(p, threads=os.cpu_count() or 1)
    p.add_argument("--sdist", type=Path, help="local llama-cpp-python sdist (.tar.gz)")
    p.add_argument("--prompts", help="prompts file or built-in set, as for specllama bench "
                                     "(default: the built-in bench set)")
    p.add_argument("--prompt-ids", help="only these prompts (comma-separated ids)")
    p.add_argument("--temperatures", default="0,0.8")
    p.add_argument("--n-ctx", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0, help="of repetition 0")
    p.add_argument("--json", type=Path, help="write every raw figure as JSON")


def comparison_prompts(args: argparse.Namespace) -> list[Any]:
    """The prompts --prompts and --prompt-ids choose."""
    from specllama.cli.bench_command.prompts import builtin_prompts, load_prompts

    prompts = load_prompts(args.prompts) if args.prompts else builtin_prompts()
    if args.prompt_ids:
        wanted = args.prompt_ids.split(",")
        prompts = [p for p in prompts if p.id in wanted]
    return prompts


def numbers(text: str, kind: type = float) -> list[Any]:
    """'2,3,4' as numbers (empty items skipped: '' is none)."""
    return [kind(x) for x in text.split(",") if x.strip()]
