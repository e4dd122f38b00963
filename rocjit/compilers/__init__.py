"""The compilers behind one call: ``compiler_for(target)`` returns one of nvrtc.py, hiprtc.py, clang.py, which
share this shape (the Compiler protocol):

    NAME                        "nvrtc" | "hiprtc" | "clang"
    version() -> str            name and version, part of the cache key
    shim_dirs() -> list[str]    include directories the compiler needs ahead of the system's
    compile(source, *, target, options, include_dirs, name_expressions, filename) -> Compiled

The target is checked first (rocjit.targets), so no vendor library ever sees a name it could abort on.
AMD: hipRTC when it is usable and builds the target, else the offline clang; ROCJIT_AMD_COMPILER=hiprtc|clang
forces one.
"""
from __future__ import annotations

import importlib
import os
from typing import Protocol

from rocjit import targets
from rocjit.errors import CompileError, PlatformError


class Compiler(Protocol):
    NAME: str

    def version(self) -> str: ...

    def shim_dirs(self) -> list[str]: ...

    def compile(self, source: str, *, target: str, options=(), include_dirs=(), name_expressions=(),
                filename: str = "kernel.hip"): ...


def _module(name: str):
    return importlib.import_module(f"rocjit.compilers.{name}")


def amd_compiler_name(target: str) -> str:
    """'hiprtc' or 'clang' for an AMD target; CompileError for one that nothing here builds."""
    from rocjit import toolchain
    from rocjit.compilers import hiprtc
    if target not in targets.AMD_TARGETS:
        raise CompileError(f"{target!r} is not an AMD GPU target rocjit knows; known targets: "
                           f"{', '.join(targets.AMD_TARGETS)}", "", target=target)
    forced = os.environ.get("ROCJIT_AMD_COMPILER", "").strip().lower()
    if forced not in ("", "hiprtc", "clang"):
        raise ValueError(f"ROCJIT_AMD_COMPILER={forced!r}: expected 'hiprtc' or 'clang'")
    if forced == "clang":
        return "clang"
    ver = hiprtc.version_tuple()
    if forced == "hiprtc":
        if ver is None:
            from rocjit.platform import hip
            raise PlatformError(f"ROCJIT_AMD_COMPILER=hiprtc but hipRTC is not usable: {hip.hiprtc_status()[1]}")
        if not hiprtc.supports(target, ver):
            raise CompileError(f"ROCJIT_AMD_COMPILER=hiprtc but hipRTC {ver[0]}.{ver[1]} cannot build {target} "
                               f"(it builds {', '.join(hiprtc.supported_targets(ver))}); unset it to use the "
                               f"offline clang ({toolchain.INSTALL_HINT})", "", target=target)
        return "hiprtc"
    if ver is not None and hiprtc.supports(target, ver):
        return "hiprtc"
    return "clang"


def compiler_for(target: str) -> Compiler:
    """The compiler that builds `target`; ValueError / CompileError before any vendor call when none can."""
    if targets.vendor(target) == "cuda":
        return _module("nvrtc")
    return _module(amd_compiler_name(target))
