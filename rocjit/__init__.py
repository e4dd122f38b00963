"""rocjit: write HIP kernels in Python strings or files; they compile at first use (hipRTC on AMD, NVRTC on NVIDIA),
are cached on disk, and launch on torch / numpy / cupy / jax arrays.

    import rocjit
    saxpy = rocjit.kernel(SRC)
    saxpy[blocks, threads](2.0, x, y, n)

Importing rocjit is cheap: vendor bindings, torch and the kernel library load on first use.
"""
__version__ = "0.1.0"

from rocjit.errors import ArgumentError, CompileError, LaunchError, PlatformError, RocjitError  # noqa: E402
# Bound eagerly (the module is light): a lazily bound name would be replaced by the submodule `rocjit.kernel`
# as soon as anything imports that submodule by its full name.
from rocjit.kernel import Kernel, Module, kernel  # noqa: E402

_LAZY = {
    "In": ("rocjit.arrays", "In"), "Out": ("rocjit.arrays", "Out"), "InOut": ("rocjit.arrays", "InOut"),
    "compile": ("rocjit.compiler", "compile"), "CodeObject": ("rocjit.compiler", "CodeObject"),
    "kernels_src_dir": ("rocjit.compiler", "kernels_src_dir"),
    "inspect": ("rocjit.inspect", "inspect"), "ops": ("rocjit.ops", None), "tune": ("rocjit.tune", None),
    "platform": ("rocjit.platform", None), "cache": ("rocjit.cache", None),
}

__all__ = ["ArgumentError", "CompileError", "LaunchError", "PlatformError", "RocjitError", "kernel", "Module", "Kernel",
           *_LAZY]


def __getattr__(name):
    spec = _LAZY.get(name)
    if spec is None:
        raise AttributeError(f"module 'rocjit' has no attribute {name!r}")
    import importlib
    mod = importlib.import_module(spec[0])
    value = mod if spec[1] is None else getattr(mod, spec[1])
    globals()[name] = value
    return value
