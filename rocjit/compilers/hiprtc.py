"""hipRTC (hip-python): HIP C++ -> AMD code object (hsaco), in process, no GPU needed.

hipRTC 5.x aborts the process (not an error code) on a target it cannot build; compilers.compiler_for() only
sends it the targets `supports()` names.
"""
from __future__ import annotations

import functools
import os
import re
import threading

from rocjit.errors import CompileError, LaunchError, PlatformError
from rocjit.platform import Compiled, hip

NAME = "hiprtc"
# Checked one by one in a child process against Debian's ROCm 5.2 hipRTC; every other name aborted it.
ROCM5_TARGETS = ("gfx803", "gfx900", "gfx906", "gfx908", "gfx90a", "gfx90c", "gfx1010", "gfx1030", "gfx1031")
# Newer targets need a newer hipRTC: (major, minor) of ROCm
MIN_VERSION = {"gfx940": (6, 0), "gfx941": (6, 0), "gfx942": (6, 0), "gfx950": (7, 0),
               "gfx1100": (6, 0), "gfx1101": (6, 0), "gfx1102": (6, 0), "gfx1200": (6, 3), "gfx1201": (6, 3)}


@functools.lru_cache(maxsize=None)
def version() -> str:
    """hipRTC's version, read from the HIP runtime it ships with (e.g. 'hiprtc 5.2.21153')."""
    hip_api, hiprtc = hip.bindings()
    try:
        runtime = hip.check(hip_api.hipRuntimeGetVersion(), "hipRuntimeGetVersion")
    except (LaunchError, RuntimeError):
        major, minor = hip.check(hiprtc.hiprtcVersion(), "hiprtcVersion")
        return f"hiprtc {major}.{minor} ({hip.library_path('hiprtc')})"
    # HIP_VERSION = major * 10_000_000 + minor * 100_000 + patch
    return f"hiprtc {runtime // 10_000_000}.{runtime // 100_000 % 100}.{runtime % 100_000}"


def version_tuple() -> tuple[int, int] | None:
    """(major, minor) of a usable hipRTC, or None."""
    try:
        if not hip.hiprtc_usable():
            return None
        major, minor = version().split()[1].split(".")[:2]
        return int(major), int(minor)
    except Exception:   # no bindings, no library, an unreadable version: hipRTC is simply not there
        return None


def supports(target: str, ver: tuple[int, int]) -> bool:
    if ver < (6, 0):
        return target in ROCM5_TARGETS
    return ver >= MIN_VERSION.get(target, (6, 0))


def supported_targets(ver: tuple[int, int]) -> list[str]:
    from rocjit import targets
    return [t for t in targets.AMD_TARGETS if supports(t, ver)]


def shim_dirs() -> list[str]:
    """ROCm 5's hipRTC has the half types built in and no bf16 header: rocjit's stand-ins for both."""
    ver = version_tuple()
    if ver is None or ver >= (6, 0):
        return []
    from rocjit.compiler import kernels_src_dir
    return [str(kernels_src_dir() / "hiprtc_shim")]


def _has_std(options) -> bool:
    return any(str(o).startswith(("-std=", "--std=")) for o in options)


def compile(source: str, *, target: str, options=(), include_dirs=(), name_expressions=(),
            filename: str = "<source>") -> Compiled:
    """source -> hsaco for `target` (e.g. 'gfx90a'). Name expressions are lowered."""
    _, hiprtc = hip.bindings()
    if not hip.hiprtc_usable():
        raise PlatformError(f"hipRTC is not usable: {hip.hiprtc_status()[1]}")
    ver = version_tuple()
    if ver is not None and not supports(target, ver):     # never hand hipRTC a target it aborts on
        raise CompileError(f"hipRTC {ver[0]}.{ver[1]} cannot build {target}; it builds "
                           f"{', '.join(supported_targets(ver))}", source, filename, target, version())
    opts = [f"--offload-arch={target}", "-O3"]
    if not _has_std(options):
        opts.append("-std=c++17")
    opts += [f"-I{d}" for d in include_dirs] + [str(o) for o in options]
    with _hiprtc_lock:
        return _compile_locked(hiprtc, source, target, opts, name_expressions, filename)


# hipRTC (comgr) in ROCm 5.x is not documented as thread-safe: one program at a time.
_hiprtc_lock = threading.Lock()


def _compile_locked(hiprtc, source, target, opts, name_expressions, filename) -> Compiled:
    prog = hip.check(hiprtc.hiprtcCreateProgram(source.encode(), os.path.basename(filename).encode(), 0, [], []),
                     "hiprtcCreateProgram")
    try:
        for expr in name_expressions:
            hip.check(hiprtc.hiprtcAddNameExpression(prog, expr.encode()), f"hiprtcAddNameExpression({expr!r})")
        encoded = [o.encode() for o in opts]
        status = hiprtc.hiprtcCompileProgram(prog, len(encoded), encoded)[0]
        # hipRTC (comgr) names the source 'CompileSource' in a temp dir: show the caller's name.
        log = re.sub(r"\S*/input/CompileSource\b", lambda _: filename, _program_log(hiprtc, prog))
        if int(status) != 0:
            raise CompileError(log or str(status), source, filename, target, version())
        code = bytearray(hip.check(hiprtc.hiprtcGetCodeSize(prog), "hiprtcGetCodeSize"))
        hip.check(hiprtc.hiprtcGetCode(prog, code), "hiprtcGetCode")
        lowered = {}
        for expr in name_expressions:
            name = hip.check(hiprtc.hiprtcGetLoweredName(prog, expr.encode()), f"hiprtcGetLoweredName({expr!r})")
            lowered[expr] = name.decode() if isinstance(name, bytes) else str(name)
    finally:
        hiprtc.hiprtcDestroyProgram(prog.createRef())   # the C API takes hiprtcProgram*
    return Compiled(binary=bytes(code), format="hsaco", target=target, lowered=lowered, log=log)


def _program_log(hiprtc, prog) -> str:
    size = hip.check(hiprtc.hiprtcGetProgramLogSize(prog), "hiprtcGetProgramLogSize")
    if not size:
        return ""
    buf = bytearray(size)
    hip.check(hiprtc.hiprtcGetProgramLog(prog, buf), "hiprtcGetProgramLog")
    return bytes(buf).rstrip(b"\0").decode(errors="replace")
