"""Time every page of the book in quick and in full mode; prints JSON and saves it.

Run: ``python benchmarks/bench_book.py [--modes quick full] [--select TEXT ...]``.
Each notebook is executed from scratch (no cache) exactly as the book build does
(papermill, kernel python3, working directory = the page's folder in a scratch
staging tree). The figures land in ``benchmarks/results/chapter_timings.json``
(written atomically), which the book's "Reproducing" page renders.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from grpo_companion.book.pipeline import (
    REPO_ROOT,
    execute_notebook,
    is_notebook_source,
    read_notebook,
    source_path,
    toc_documents,
    write_if_changed,
)

RESULTS = REPO_ROOT / "benchmarks" / "results" / "chapter_timings.json"


def machine() -> dict[str, object]:
    import torch

    info: dict[str, object] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _renders_results(src: Path) -> bool:
    deps = read_notebook(src).metadata.get("grpo_companion", {}).get("depends_on_files", [])
    return str(RESULTS.relative_to(REPO_ROOT)) in deps


def time_mode(quick: bool, select: list[str]) -> dict[str, float]:
    """Seconds per page for one mode, executed in toc order in a scratch tree."""
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="grpo-bench-book-") as tmp:
        stage = Path(tmp)
        for doc in toc_documents(REPO_ROOT):
            src = source_path(REPO_ROOT, doc)
            if not is_notebook_source(src) or (select and not any(s in doc for s in select)):
                continue
            if _renders_results(src):  # the Reproducing page shows these very figures
                continue
            target = stage / f"{doc}.ipynb"
            target.parent.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            execute_notebook(read_notebook(src), target, {"quick": quick}, cwd=target.parent,
                             cell_timeout=1800)
            seconds[doc] = round(time.perf_counter() - start, 1)
            print(f"  {'quick' if quick else 'full '} {doc}: {seconds[doc]:.1f} s", flush=True)
    return seconds


def main() -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--modes", nargs="+", choices=["quick", "full"], default=["quick", "full"])
    parser.add_argument("--select", nargs="*", default=[],
                        help="time only pages whose name contains one of these strings")
    args = parser.parse_args()
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    result: dict[str, object] = {"machine": machine(), "modes": dict(previous.get("modes", {}))}
    for mode in args.modes:
        timings = time_mode(mode == "quick", args.select)
        merged = dict(result["modes"].get(mode, {})) if args.select else {}
        merged.update(timings)
        result["modes"][mode] = merged
        result["total_seconds"] = {m: round(sum(t.values()), 1)
                                   for m, t in result["modes"].items()}
        # saved after each mode, so an interrupted run keeps what it measured
        write_if_changed(RESULTS, (json.dumps(result, indent=2, sort_keys=True) + "\n").encode())
    print(json.dumps(result, indent=2, sort_keys=True))
    return result


if __name__ == "__main__":
    main()
