"""python -m rocjit [--version | doctor | check | cache | toolchain | bench] — see `python -m rocjit --help`."""
from __future__ import annotations

import argparse
import json
import sys


def doctor(argv=()) -> int:
    import platform as pyplatform

    import rocjit
    from rocjit import cache, platform
    print(f"rocjit {rocjit.__version__}  (python {pyplatform.python_version()}, {sys.platform})")
    print(f"kernel sources : {rocjit.kernels_src_dir()}")
    for name in platform.PLATFORMS:
        try:
            mod = platform.backend(name)
            if mod.is_available():
                print(f"platform {name:4s}  : {mod.device_count()} GPU(s)")
                for d in range(mod.device_count()):
                    a = mod.device_attributes(d)
                    units = a.get("sm_count", a.get("cu_count", "?"))
                    print(f"  [{d}] {a.get('name')}  target {a.get('target')}  {units} SMs/CUs  "
                          f"L2 {a.get('l2_bytes', 0) / 2**20:.0f} MiB")
            else:
                print(f"platform {name:4s}  : no GPU ({mod.unavailable_reason()})")
        except Exception as e:  # a broken binding is reported, not fatal
            print(f"platform {name:4s}  : unavailable ({type(e).__name__}: {e})")
    try:
        from rocjit.compilers import nvrtc
        print(f"compiler sm_*  : {nvrtc.version()}  (CUDA headers: {', '.join(nvrtc.cuda_include_dirs()) or 'missing'})")
    except Exception as e:
        print(f"compiler sm_*  : unavailable ({e}); install rocjit with its cuda extra "
              f"(in a clone: pip install \".[cuda]\")")
    try:
        from rocjit import toolchain
        for line in amd_compiler_lines(toolchain.status()):
            print(line)
    except Exception as e:
        print(f"compiler gfx*  : unavailable ({e})")
    from rocjit import native
    native.module()
    print(f"native launch  : {native.status()}")
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        native.torch_alloc()
        print(f"torch alloc    : {native.torch_alloc_status()}")
    info = cache.info()
    print(f"cache          : {info['dir']}  {info['entries']} entries, {info['bytes'] / 2**20:.1f} MiB, "
          f"{info['hits']} hits / {info['misses']} misses")
    try:
        selected = platform.get().NAME
        print(f"selected       : {selected}")
    except Exception as e:
        print(f"selected       : none — {e}")
    return 0


def amd_compiler_lines(status: dict) -> list[str]:
    """toolchain.status() as report lines: one per compiler, then which compiler builds each gfx target."""
    lines = []
    hiprtc = status.get("hiprtc", {})
    if hiprtc.get("usable"):
        lines.append(f"compiler hiprtc: {hiprtc.get('version', 'version unknown')}  ({hiprtc.get('library')})")
    elif hiprtc:
        lines.append(f"compiler hiprtc: unusable ({hiprtc.get('reason', 'no reason given')})")
    clang = status.get("clang", {})
    if clang.get("installed"):
        lines.append(f"compiler clang : {clang.get('version', 'version unknown')}  ({clang.get('path')})")
    elif clang:
        lines.append(f"compiler clang : not installed in {clang.get('dir')}" +
                     (f"; {clang['hint']}" if clang.get("hint") else ""))
    targets = status.get("targets", {})
    if targets:
        lines.append("AMD targets    : " + ", ".join(f"{t} -> {c}" for t, c in targets.items()))
    for key in status.keys() - {"hiprtc", "clang", "targets"}:   # anything newer is still shown, not dropped
        lines.append(f"{key:15s}: {status[key]}")
    return lines


def cache_cmd(argv) -> int:
    from rocjit import cache
    ap = argparse.ArgumentParser(prog="python -m rocjit cache", description="Show or clear the code-object cache.")
    ap.add_argument("--clear", action="store_true", help="remove every cached code object")
    ap.add_argument("--json", action="store_true", help="print the information as JSON")
    args = ap.parse_args(argv)
    if args.clear:
        print(f"removed {cache.clear()} entries from {cache.cache_dir()}")
        return 0
    info = cache.info()
    if args.json:
        print(json.dumps(info))
    else:
        print(f"location : {info['dir']}\nentries  : {info['entries']}\nsize     : {info['bytes']} bytes"
              f"\nhits     : {info['hits']}\nmisses   : {info['misses']}")
    return 0


def bench_cmd(argv) -> int:
    from rocjit.bench import harness
    return harness.main(argv)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        import rocjit
        print(f"rocjit {rocjit.__version__}")
        return 0
    cmd = argv.pop(0) if argv and not argv[0].startswith("-") else "doctor"
    if cmd in ("-h", "--help") or (cmd == "doctor" and argv[:1] in (["-h"], ["--help"])):
        print(__doc__)
        print("  --version          print the version and exit\n"
              "  doctor (default)   platform, GPUs and targets, compilers, cache\n"
              "  check              compile library kernels for sm_90a,gfx90a,gfx942,gfx950 and print resources\n"
              "  cache [--clear]    code-object cache location, entries, size, hits/misses\n"
              "  toolchain install  install the offline clang toolchain for gfx942/gfx950\n"
              "  bench SUITE        run a benchmark suite (launch, norm, swiglu, quant, gemv, skinny, liger, all)")
        return 0
    if cmd == "doctor":
        if argv:
            print(f"doctor takes no arguments, got {' '.join(argv)}; see python -m rocjit --help", file=sys.stderr)
            return 2
        return doctor(argv)
    if cmd == "cache":
        return cache_cmd(argv)
    if cmd == "check":
        from rocjit import check
        return check.main(argv)
    if cmd == "toolchain":
        from rocjit import toolchain
        return toolchain.main(argv)
    if cmd == "bench":
        return bench_cmd(argv)
    print(f"unknown command {cmd!r}; see python -m rocjit --help", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
