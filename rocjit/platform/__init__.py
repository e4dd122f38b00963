"""Vendor backends: ``cuda.py`` and ``hip.py`` each implement the whole ``Platform`` protocol below, so the core
never asks which vendor it runs on. Vendor quirks (the CUDA driver's PTX downgrade, HIP's library names) stay in
the vendor's file. Nothing here imports a vendor binding at module import time: ``get()`` does it lazily.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

PLATFORMS = ("cuda", "hip")


@dataclass
class Compiled:
    """What a vendor compiler returns: the code object and how template names were lowered."""
    binary: bytes
    format: str                      # "cubin" | "ptx" | "hsaco"
    target: str
    lowered: dict = field(default_factory=dict)   # name expression -> mangled symbol
    log: str = ""
    key: str = ""                    # cache key (set by rocjit.compiler)

    def __repr__(self):
        # the binary is kilobytes to megabytes: name what it is, never print it
        names = self.kernel_names()
        shown = ", ".join(names[:6]) + (f", ... ({len(names)} kernels)" if len(names) > 6 else "")
        return (f"<CodeObject {self.target} {self.format}, {len(self.binary)} bytes, kernels [{shown}], "
                f"key {self.key[:16] or 'none'}>")

    def kernel_names(self) -> list[str]:
        """The name expressions it was compiled for, else the kernel symbols its ELF declares."""
        if self.lowered:
            return list(self.lowered)
        try:
            from rocjit import codeobject   # the ELF reader; no vendor binding is loaded for it
            if self.format == "hsaco":      # every AMD kernel has a `<name>.kd` descriptor symbol
                return [s.name[:-3] for s in codeobject.elf_symbols(self.binary) if s.name.endswith(".kd")]
            if self.format == "cubin":      # every NVIDIA kernel has its own `.nv.info.<name>` section
                return [s.name[9:] for s in codeobject.elf_sections(self.binary) if s.name.startswith(".nv.info.")]
        except Exception:                   # a damaged binary still gets a repr
            pass
        return []


class FastLaunch(NamedTuple):
    """What generated Python launchers call: ``call(function, gx, gy, gz, bx, by, bz, shared_mem, stream,
    params_address, 0)``, a compiled binding of the driver's launch function."""
    call: Callable
    wrap_function: Callable      # a loaded function -> what `call` takes as its first argument
    success: Any                 # what `call` returns (or returns first, when returns_tuple) on success
    returns_tuple: bool


@runtime_checkable
class Platform(Protocol):
    """One vendor's runtime: devices, loading, launching and the memory staging needs."""
    NAME: str
    DLPACK_DEVICE_TYPE: int      # what the framework's DLPack exchange reports for this vendor's GPUs

    def is_available(self) -> bool: ...
    def unavailable_reason(self) -> str: ...
    def device_count(self) -> int: ...
    def device_name(self, dev: int) -> str: ...
    def device_target(self, dev: int) -> str: ...
    def device_attributes(self, dev: int) -> dict: ...

    def load(self, code: Compiled, dev: int, recompile: Callable[[str], Compiled]) -> Any:
        """The code object as a module on `dev` (current); `recompile(target)` builds it for another target."""
    def get_function(self, module, mangled: str) -> Any: ...
    def function_handle(self, fn) -> int:
        """The raw function handle the driver's launch call takes."""
    def function_info(self, fn) -> dict: ...
    def set_max_dynamic_shared(self, fn, nbytes: int) -> None: ...
    def context_handle(self, dev: int) -> int:
        """`dev`'s context: the native launcher launches only while it is current."""
    def push_current(self, dev: int) -> bool:
        """Make `dev` current; True when pop_current() must restore the caller's afterwards."""
    def pop_current(self) -> None: ...

    def launch(self, fn, grid, block, shared_mem: int, stream: int, kernel_params) -> int:
        """kernel_params: a ctypes array of void*, one per parameter. Returns the driver's error code."""
    def fast_launch(self) -> FastLaunch: ...
    def native_launch(self, pdl: bool = False) -> tuple[int, int]:
        """(launch function address, current-context getter address) for rocjit/launcher.c; with `pdl`, a
        launch that lets the kernel overlap the one ahead of it (programmatic dependent launch) where the
        platform has one."""
    def error_name(self, code) -> str: ...

    def malloc(self, nbytes: int, dev: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def memcpy_htod(self, dst: int, src_ptr: int, nbytes: int) -> None: ...
    def memcpy_dtoh(self, dst_ptr: int, src: int, nbytes: int) -> None: ...
    def synchronize(self, dev: int) -> None: ...
    def check_last(self, dev: int) -> None:
        """Raise LaunchError on a sticky error from an earlier launch."""
    def pointer_device(self, ptr: int) -> int | None:
        """The device ordinal owning `ptr`, None for host memory."""


_selected = None


def backend(name: str):
    """The vendor module by name, imported on demand."""
    if name not in PLATFORMS:
        raise ValueError(f"unknown platform {name!r}; expected one of {PLATFORMS}")
    return importlib.import_module(f"rocjit.platform.{name}")


def get():
    """The platform that runs kernels: ROCJIT_PLATFORM=hip|cuda, else whichever sees a GPU."""
    global _selected
    if _selected is not None:
        return _selected
    forced = os.environ.get("ROCJIT_PLATFORM", "").strip().lower()
    if forced:
        mod = backend(forced)
        if not mod.is_available():
            from rocjit.errors import PlatformError
            raise PlatformError(f"ROCJIT_PLATFORM={forced} but no {forced} GPU is visible: {mod.unavailable_reason()}")
        _selected = mod
        return mod
    reasons = []
    for name in PLATFORMS:
        try:
            mod = backend(name)
        except ImportError as e:
            reasons.append(f"{name}: {e}")
            continue
        if mod.is_available():
            _selected = mod
            return mod
        reasons.append(f"{name}: {mod.unavailable_reason()}")
    from rocjit.errors import PlatformError
    raise PlatformError("no GPU found. " + "; ".join(reasons) +
                        ". Compiling for a named target works without a GPU: rocjit.compile(src, target='sm_90a').")
