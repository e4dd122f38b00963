"""Shared benchmark machinery: timing by events or CUDA-graph replays (medians), rotated input sets beyond L2,
the two ceilings (copy bandwidth, best library matmul), the result JSON and its plot.

Result JSON (one shape for every suite):
    {"suite", "gpu", "commit", "date", "ceilings": {...},
     "rows": [{"case", "shape", "dtype", "ours_us", "peers_us": {name: us}, "floor_us", ...}]}
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

from rocjit import tune



def _suites() -> tuple:
    """Every suite module beside this one (each defines run(argv) -> result); launch first, then by name."""
    import pkgutil
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name != "harness" and not m.name.startswith("_"))
    return tuple(sorted(names, key=lambda n: n != "launch"))


SUITES = _suites()


def _torch():
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks need a GPU visible to torch")
    return torch


# ----------------------------------------------------------------------------- timing
def time_events(fn, *, warmup: int = 10, reps: int = 100) -> float:
    """Median µs of fn() timed with device events, one event pair per call."""
    _torch()
    return tune.time_gpu(fn, warmup=warmup, reps=reps) * 1e6


def time_graph(fns, *, reps: int = 50, warmup: int = 3, keep: list | None = None) -> float:
    """Median µs per call of the callables `fns` (e.g. one per rotated input set), captured once into a CUDA graph
    and replayed `reps` times (rocjit.tune.time_graph; a failed capture is an error here, not an event fallback;
    `keep` receives the graph)."""
    _torch()
    return tune.time_graph(fns, reps=reps, warmup=warmup, fallback=False, keep=keep) * 1e6


def time_graph_or_events(fns, *, reps: int = 50, warmup: int = 3, keep: list | None = None,
                         note=None) -> tuple[float, str]:
    """(median µs per call, "graph") of the callables `fns` as graph replays (time_graph); where the capture fails,
    (µs, "events") from device events around passes over them (time_rotating), which include the host's launch time
    wherever it outlasts the kernel, and `note(text)` is told why."""
    fns = list(fns)
    try:
        return time_graph(fns, reps=reps, warmup=warmup, keep=keep), "graph"
    except Exception as e:  # noqa: BLE001 -- any capture failure: the device events still time the GPU work
        import torch
        if torch.cuda.is_available():   # whatever the failed capture left on the stream, done before the events
            torch.cuda.synchronize()
        if note is not None:
            note(f"CUDA-graph capture failed ({type(e).__name__}: {e}); timed with events, which include the host's "
                 f"launch time wherever it outlasts the kernel")
        return time_rotating(fns, graph=False, reps=reps), "events"


def time_rotating(fns, *, graph: bool, reps: int = 50) -> float:
    """Median µs per call over rotated input sets: graph replays (small, launch-bound cases) or events."""
    fns = list(fns)
    if graph:
        return time_graph(fns, reps=reps)
    torch = _torch()
    for f in fns:
        f()
    torch.cuda.synchronize()
    times = []
    for r in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for f in fns:
            f()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / len(fns))
    return statistics.median(times)


def rotation_count(bytes_per_set: int, *, l2_bytes: int | None = None, at_least: int = 2, at_most: int = 64) -> int:
    """How many distinct input sets make one pass over them touch more than twice the L2 cache."""
    if l2_bytes is None:
        l2_bytes = _torch().cuda.get_device_properties(0).L2_cache_size
    return max(at_least, min(at_most, math.ceil(2 * l2_bytes / max(1, bytes_per_set)) + 1))


# ----------------------------------------------------------------------------- ceilings
def measure_ceilings(*, matmul: bool = True, fp8: bool = False) -> dict:
    """Device-to-device copy bandwidth (bytes read + written) and library matmul rates, measured now."""
    torch = _torch()
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    src.random_(0, 255)
    dst = torch.empty_like(src)
    us = time_events(lambda: dst.copy_(src), warmup=3, reps=20)
    out = {"copy_GBps": 2 * n / (us * 1e-6) / 1e9}
    if matmul:
        m = 8192
        a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        us = time_events(lambda: a @ b, warmup=3, reps=10)
        out["bf16_matmul_TFLOPs"] = 2 * m ** 3 / (us * 1e-6) / 1e12
        if fp8 and hasattr(torch, "float8_e4m3fn"):
            a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()
            one = torch.ones((), device="cuda")
            us = time_events(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16), warmup=3, reps=10)
            out["fp8_matmul_TFLOPs"] = 2 * m ** 3 / (us * 1e-6) / 1e12
        del a, b
    del src, dst
    torch.cuda.empty_cache()
    return out


def floor_us(nbytes: int, ceilings: dict) -> float:
    """Speed-of-light time to move `nbytes` at the measured copy bandwidth."""
    return nbytes / (ceilings["copy_GBps"] * 1e9) * 1e6


# ----------------------------------------------------------------------------- results
def quick(argv) -> bool:
    """A suite's own arguments: only --quick (fewer shapes)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    return ap.parse_args(argv).quick


def new_result(suite: str, ceilings: dict | None = None) -> dict:
    gpu = "unknown"
    try:
        import torch
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return {"suite": suite, "gpu": gpu, "commit": _commit(), "date": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%dT%H:%M:%SZ"), "ceilings": ceilings or {}, "rows": []}


def add_row(result: dict, case: str, shape, dtype: str, ours_us: float | None, peers_us: dict,
            floor: float | None = None, **extra) -> dict:
    row = {"case": case, "shape": list(shape), "dtype": dtype, "ours_us": ours_us,
           "peers_us": {k: v for k, v in peers_us.items()}, "floor_us": floor, **extra}
    result["rows"].append(row)
    return row


def _commit() -> str:
    if os.environ.get("ROCJIT_COMMIT"):
        return os.environ["ROCJIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=5).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def format_table(result: dict) -> str:
    rows = result["rows"]
    peers = sorted({p for r in rows for p in r["peers_us"]})
    head = ["case", "shape", "dtype", "ours_us", *[f"{p}_us" for p in peers], "floor_us",
            *[f"speedup_vs_{p}" for p in peers], "SOL%"]
    lines = [" | ".join(head)]
    for r in rows:
        ours = r["ours_us"]
        cells = [r["case"], "x".join(map(str, r["shape"])), r["dtype"], _f(ours)]
        cells += [_f(r["peers_us"].get(p)) for p in peers]
        cells.append(_f(r.get("floor_us")))
        # speed-up of ours over each peer (peer time / ours), >1 means we are faster
        cells += [_f(r["peers_us"][p] / ours, 2) + "x" if ours and r["peers_us"].get(p) else "-" for p in peers]
        cells.append(_f(100 * r["floor_us"] / ours, 1) if ours and r.get("floor_us") else "-")
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def _f(v, nd=2):
    return "-" if v is None else f"{v:.{nd}f}"


def plot(result: dict, path: str) -> None:
    """µs vs rows (the first shape dimension) per case, log-log; peers dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    groups = {}
    for r in result["rows"]:
        if r.get("ours_us") is None:
            continue
        key = (r["case"], r["dtype"], tuple(r["shape"][1:]))
        groups.setdefault(key, []).append(r)
    n = max(1, len(groups))
    cols = min(3, n)
    fig, axes = plt.subplots((n + cols - 1) // cols, cols, figsize=(5.5 * cols, 4 * ((n + cols - 1) // cols)),
                             squeeze=False)
    for ax, ((case, dtype, rest), rows) in zip(axes.flat, sorted(groups.items())):
        rows = sorted(rows, key=lambda r: r["shape"][0])
        xs = [r["shape"][0] for r in rows]
        ax.plot(xs, [r["ours_us"] for r in rows], "o-", label="rocjit", lw=2)
        for p in sorted({p for r in rows for p in r["peers_us"]}):
            pts = [(r["shape"][0], r["peers_us"][p]) for r in rows if r["peers_us"].get(p)]
            if pts:
                ax.plot(*zip(*pts), "s--", label=p, alpha=0.8)
        fl = [(r["shape"][0], r["floor_us"]) for r in rows if r.get("floor_us")]
        if fl:
            ax.plot(*zip(*fl), ":", color="gray", label="floor (copy SOL)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.set_title(f"{case} {dtype} x{'x'.join(map(str, rest))}", fontsize=9)
        ax.set_xlabel("rows (first dim)")
        ax.set_ylabel("µs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.suptitle(f"rocjit {result['suite']} — {result['gpu']} — {result['commit']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- CLI
def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100': the results folder for a GPU."""
    import re
    m = re.search(r"\b(h100|h200|h20|b200|gb200|a100|l40s?|mi\d{3}x?|rtx\s?\d{4})\b", name.lower())
    return (m.group(1) if m else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")).replace(" ", "")


def _run_suite(suite: str, rest, quick: bool, json_path: str | None) -> dict:
    mod = importlib.import_module(f"rocjit.bench.{suite}")
    result = mod.run(list(rest) + (["--quick"] if quick else []))
    # a suite may bring its own table and plot (roofline does); the shared ones otherwise
    print(getattr(mod, "format_table", format_table)(result))
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result, indent=1))
        if suite != "launch" and result["rows"]:
            getattr(mod, "plot", plot)(result, str(Path(json_path).with_suffix(".png")))
        print(f"wrote {json_path}")
    return result


def gpu_missing() -> str | None:
    """Why no suite can run here (None when torch sees a GPU): every suite, `all` included, stops on it alike."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no GPU visible to torch"
    return None


def main(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m rocjit bench", description="Run a benchmark suite on the GPU.")
    ap.add_argument("suite", choices=SUITES + ("all",))
    ap.add_argument("--json", help="write the result JSON here (a PNG plot is written beside it); with `all`, "
                                   "a directory (default benchmarks/results/<gpu>/)")
    ap.add_argument("--quick", action="store_true", help="fewer shapes and repetitions (smoke run)")
    args, rest = ap.parse_known_args(argv)
    why = gpu_missing()
    if why:
        print(f"bench {args.suite}: {why}; nothing measured (benchmarks need a GPU)", file=sys.stderr)
        return 1
    if args.suite != "all":
        _run_suite(args.suite, rest, args.quick, args.json)
        return 0
    import torch
    out = Path(args.json or Path("benchmarks") / "results" / gpu_slug(torch.cuda.get_device_name(0)))
    failed = []
    for suite in SUITES:
        try:
            _run_suite(suite, rest, args.quick, str(out / f"{suite}.json"))
        except Exception as e:   # one broken suite must not hide the others' numbers
            print(f"suite {suite} failed: {type(e).__name__}: {e}", file=sys.stderr)
            failed.append(suite)
    return 1 if failed else 0
