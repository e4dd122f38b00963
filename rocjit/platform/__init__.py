"""Vendor backends. Each module (``cuda.py``, ``hip.py``) exposes the same small interface:

    NAME                                   "cuda" | "hip"
    is_available() -> bool                 a driver and at least one GPU are visible (cached)
    device_count() -> int
    device_name(dev) -> str
    device_target(dev) -> str              "sm_90a", "gfx942", ...
    device_attributes(dev) -> dict         sm_count / cu_count, max_shared_per_block_optin, warp_size, l2_bytes
    compiler_version() -> str
    compile(source, *, target, options, include_dirs, name_expressions, filename) -> Compiled
    load_module(binary, dev) -> module     in the device's primary context
    get_function(module, mangled) -> fn
    function_info(fn) -> dict              num_regs, shared_bytes, local_bytes, max_threads
    param_layout(binary, module, fn, mangled, count=None) -> list[(offset, size)] | None
    set_max_dynamic_shared(fn, nbytes)
    launch(fn, grid, block, shared_mem, stream, kernel_params)
                                           kernel_params: ctypes array of void* (one per parameter)
    malloc(nbytes, dev) / free(ptr) / memcpy_htod(dst, src_ptr, n) / memcpy_dtoh(dst_ptr, src, n)
    synchronize(dev) / check_last(dev)     check_last raises LaunchError on a sticky error
    pointer_device(ptr) -> int | None      device ordinal of device memory, None for host memory
    set_current(dev)                       make the device's primary context current
    push_current(dev) -> bool / pop_current()   optional: the same for one launch, restoring the caller's context
    error_name(code) -> str

Nothing here imports a vendor binding at module import time: ``get()`` does it lazily.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field

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
            from rocjit.platform import hip  # the ELF reader; no vendor binding is loaded for it
            if self.format == "hsaco":      # every AMD kernel has a `<name>.kd` descriptor symbol
                return [s.name[:-3] for s in hip.elf_symbols(self.binary) if s.name.endswith(".kd")]
            if self.format == "cubin":      # every NVIDIA kernel has its own `.nv.info.<name>` section
                return [s.name[9:] for s in hip.elf_sections(self.binary) if s.name.startswith(".nv.info.")]
        except Exception:                   # a damaged binary still gets a repr
            pass
        return []


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


def backend_for_target(target: str):
    """The vendor module whose compiler builds for `target` (sm_* -> cuda, gfx* -> hip)."""
    if target.startswith(("sm_", "compute_")):
        return backend("cuda")
    if target.startswith("gfx"):
        return backend("hip")
    raise ValueError(f"target {target!r} is neither an NVIDIA sm_XX nor an AMD gfxNNN target")
