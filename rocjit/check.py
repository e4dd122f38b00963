"""`python -m rocjit check`: compile library kernels for every target and show what they use.

    python -m rocjit check [--target sm_90a,gfx90a,gfx942,gfx950] [-D NAME[=VALUE]]... [--json PATH] [files...]

Default files: every *.hip in kernels_src/. Which template instantiations to build is written in
the kernel file itself, one per line:

    // rocjit:check rms_norm_kernel<__half, 8>

A file without such lines is compiled as-is and all its (non-template) __global__ kernels are
reported. Rows are named by their `rocjit:check` line (the same on every target), else by the kernel's demangled
name without its return type and parameter list. Exit status 1 when anything fails to compile, spills, or uses
scratch memory.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rocjit.errors import CompileError, RocjitError

DEFAULT_TARGETS = ("sm_90a", "gfx90a", "gfx942", "gfx950")
_CHECK_LINE = re.compile(r"^\s*//\s*rocjit:check\s+(.+?)\s*$", re.M)


def name_expressions(source: str) -> list[str]:
    """The `// rocjit:check <name expression>` lines of a kernel file, in order."""
    return list(dict.fromkeys(m.group(1) for m in _CHECK_LINE.finditer(source)))


def _kernels_src_dir() -> Path:
    try:
        from rocjit.compiler import kernels_src_dir
        return Path(kernels_src_dir())
    except (ImportError, FileNotFoundError):
        here = Path(__file__).resolve().parent
        for cand in (here / "kernels_src", here.parent / "kernels_src"):
            if cand.is_dir():
                return cand
        raise FileNotFoundError("kernels_src/ not found: pass kernel files explicitly")


def default_files() -> list[Path]:
    return sorted(_kernels_src_dir().glob("*.hip"))


def _compile(path: Path, target: str, names: list[str], defines: dict | None = None):
    """Through rocjit.compile (cached); NVIDIA builds ask ptxas for its spill report."""
    options = ["-Xptxas=-v"] if target.startswith("sm_") else []
    try:
        from rocjit.compiler import compile as rocjit_compile
    except ImportError:
        macros = [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in (defines or {}).items()]
        return _direct_compile(path, target, macros + options, names)
    return rocjit_compile(path, target, defines=defines, options=options, name_expressions=tuple(names))


def _direct_compile(path: Path, target: str, options, names):
    """Fallback when rocjit.compiler is not available: the vendor compilers, uncached."""
    source = path.read_text()
    dirs = [str(path.parent), str(_kernels_src_dir())]
    from rocjit.compilers import compiler_for
    compiler = compiler_for(target)
    return compiler.compile(source, target=target, options=options, include_dirs=dirs + compiler.shim_dirs(),
                            name_expressions=names, filename=path.name)


def short_name(demangled: str) -> str:
    """'void scale<__half, 8>(__half const*, int)' -> 'scale<__half, 8>': kernels return void, and the parameter
    list is the part that makes library names too long to tell apart in a table."""
    name = demangled[5:] if demangled.startswith("void ") else demangled
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                return name[:i] or demangled
    return name


def _label_rows(rows: list[dict], expressions: dict) -> None:
    """Name each row by its `rocjit:check` expression, else its short name; overloads that would share a short
    name keep their full demangled name."""
    for row in rows:
        row["demangled"] = row["kernel"]
        row["kernel"] = expressions.get(row["symbol"]) or short_name(row["demangled"])
    seen: dict[str, int] = {}
    for row in rows:
        seen[row["kernel"]] = seen.get(row["kernel"], 0) + 1
    for row in rows:
        if seen[row["kernel"]] > 1:
            row["kernel"] = row["demangled"]


def check_one(path: Path, target: str, defines: dict | None = None) -> dict:
    """Compile one file for one target; {"file", "target", "ok", "error", "kernels": [summary rows], "seconds"}."""
    from rocjit.inspect import resources, summary_row
    started = time.time()
    result = {"file": path.name, "target": target, "ok": True, "error": None, "kernels": []}
    try:
        source = path.read_text()
        names = name_expressions(source)
        co = _compile(path, target, names, defines)
        if co.format not in ("hsaco", "cubin"):
            result["kernels"] = []
            result["error"] = f"compiled to {co.format}, which holds no machine code to inspect"
        else:
            expressions = {mangled: expr for expr, mangled in co.lowered.items()}
            for r in resources(co):
                row = summary_row(r)
                problems = []
                if r.spilled:
                    problems.append("spills")
                if r.uses_scratch:
                    problems.append(f"scratch {r.scratch_bytes} B")
                row["status"] = "FAIL: " + ", ".join(problems) if problems else "ok"
                row["resources"] = r.as_dict()
                result["ok"] &= not problems
                result["kernels"].append(row)
            _label_rows(result["kernels"], expressions)
    except (CompileError, RocjitError, OSError, ValueError, KeyError) as e:
        result["ok"] = False
        result["error"] = f"{type(e).__name__}: {e}"
    result["seconds"] = round(time.time() - started, 2)
    return result


TABLE_COLUMNS = ("kernel", "target", "registers", "shared", "scratch", "spills", "occupancy",
                 "ld128", "st128", "matrix", "status")


def print_report(results: list[dict], out=None):
    from rocjit.inspect import format_table
    out = out or sys.stdout
    by_file: dict[str, list[dict]] = {}
    for r in results:
        by_file.setdefault(r["file"], []).append(r)
    for file, items in by_file.items():
        print(f"\n== {file}", file=out)
        rows = [k for r in items for k in r["kernels"]]
        rows.sort(key=lambda k: (k["kernel"], k["target"]))
        if rows:   # names in full: cut, library instantiations would look identical
            print(format_table(rows, TABLE_COLUMNS, max_name=10 ** 6), file=out)
        for r in items:
            if r["error"]:
                status = "FAILED" if not r["ok"] else "note"
                print(f"[{status}] {r['target']}: {r['error']}", file=out)


def json_row(file: str, row: dict) -> dict:
    """A table row for the JSON document: counts as numbers (the table's text cells are for reading only)."""
    r = row["resources"]
    isa = r.get("isa") or {}
    return {"file": file, "kernel": row["kernel"], "demangled": row["demangled"], "symbol": row["symbol"],
            "target": row["target"], "status": row["status"],
            **{k: r.get(k) for k in ("registers", "vgpr", "agpr", "sgpr", "shared_bytes", "scratch_bytes", "spills",
                                     "max_threads", "block", "occupancy")},
            "ld128": isa.get("global_load_128"), "st128": isa.get("global_store_128"), "matrix": isa.get("matrix"),
            "lds_ops": isa.get("lds"), "instructions": isa.get("total"), "resources": r}


def parse_defines(values) -> dict:
    """['VEC=8', 'USE_X'] -> {'VEC': '8', 'USE_X': None}; raises ValueError on a malformed name."""
    defines = {}
    for item in values or ():
        name, sep, value = item.partition("=")
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise ValueError(f"{item!r} is not NAME or NAME=VALUE")
        defines[name] = value if sep else None
    return defines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rocjit check",
                                     description="Compile kernels for each target and print registers, LDS/shared, "
                                                 "scratch/spills, occupancy and ISA statistics.")
    parser.add_argument("--target", default=",".join(DEFAULT_TARGETS),
                        help=f"comma-separated targets (default {','.join(DEFAULT_TARGETS)})")
    parser.add_argument("-D", "--define", action="append", default=[], metavar="NAME[=VALUE]",
                        help="define a macro for every file (repeatable): -D VEC=8 or -DVEC=8")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON (counts as numbers)")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1), help="parallel compiles")
    parser.add_argument("files", nargs="*", help="kernel files (default: every *.hip in kernels_src/)")
    args = parser.parse_args(argv)
    targets = [t.strip() for t in args.target.split(",") if t.strip()]
    bad = [t for t in targets if not re.fullmatch(r"sm_\d+[af]?|gfx[0-9a-f]+", t)]
    if bad:
        parser.error(f"--target: {', '.join(bad)} not understood; expected e.g. sm_90a,gfx90a,gfx942,gfx950")
    try:
        defines = parse_defines(args.define)
    except ValueError as e:
        parser.error(f"-D/--define: {e}")
    files = [Path(f) for f in args.files] if args.files else default_files()
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        parser.error(f"no such kernel file: {', '.join(missing)}")
    if not files:
        print("no kernel files to check", file=sys.stderr)
        return 1
    started = time.time()
    jobs = [(f, t) for f in files for t in targets]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda job: check_one(*job, defines), jobs))
    print_report(results)
    failed = [r for r in results if not r["ok"]]
    kernels = sum(len(r["kernels"]) for r in results)
    print(f"\n{len(files)} files x {len(targets)} targets, {kernels} kernel builds, {len(failed)} failing, "
          f"{time.time() - started:.1f} s")
    if args.json:
        rows = [json_row(r["file"], k) for r in results for k in r["kernels"]]
        doc = {"targets": targets, "defines": defines, "files": [str(f) for f in files], "rows": rows,
               "failures": [{"file": r["file"], "target": r["target"], "error": r["error"],
                             "kernels": [k["kernel"] for k in r["kernels"] if k.get("status") != "ok"]}
                            for r in failed]}
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
