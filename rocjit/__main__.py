"""python -m rocjit [doctor | check | cache | toolchain | bench] — see `python -m rocjit --help`."""
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
        print(f"compiler sm_*  : unavailable ({e}); pip install 'rocjit[cuda]'")
    try:
        from rocjit import toolchain
        for k, v in toolchain.status().items():
            print(f"compiler {k:6s}: {v}")
    except Exception as e:
        print(f"compiler gfx*  : unavailable ({e})")
    from rocjit import native
    native.module()
    print(f"native launch  : {native.status()}")
    info = cache.info()
    print(f"cache          : {info['dir']}  {info['entries']} entries, {info['bytes'] / 2**20:.1f} MiB, "
          f"{info['hits']} hits / {info['misses']} misses")
    try:
        selected = platform.get().NAME
        print(f"selected       : {selected}")
    except Exception as e:
        print(f"selected       : none — {e}")
    return 0


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
    cmd = argv.pop(0) if argv and not argv[0].startswith("-") else "doctor"
    if cmd in ("-h", "--help") or (cmd == "doctor" and argv[:1] in (["-h"], ["--help"])):
        print(__doc__)
        print("  doctor (default)   platform, GPUs and targets, compilers, cache\n"
              "  check              compile library kernels for sm_90a,gfx90a,gfx942,gfx950 and print resources\n"
              "  cache [--clear]    code-object cache location, entries, size, hits/misses\n"
              "  toolchain install  install the offline clang toolchain for gfx942/gfx950\n"
              "  bench SUITE        run a benchmark suite (launch, norm, swiglu, quant, gemv, skinny, liger, all)")
        return 0
    if cmd == "doctor":
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
