"""rocjit's kernel library: fused memory-bound inference ops and GEMV / skinny GEMM.

Each op takes torch tensors (or cupy / numpy arrays, returned in kind), compiles its kernel on first use
and launches on the current stream; torch.compile traces them as torch.ops.rocjit.* custom ops.
"""
from rocjit.ops.norm import rms_norm
from rocjit.ops.swiglu import swiglu
from rocjit.ops.quant import quantize_fp8, quantize_fp8_dual, quantize_fp8_weight

import sys as _sys

if "torch" in _sys.modules:  # torch is already loaded: register the custom ops for torch.compile now
    from rocjit.ops._common import register_custom_ops as _register
    _register()

__all__ = ["rms_norm", "swiglu", "quantize_fp8", "quantize_fp8_weight", "quantize_fp8_dual"]


def __getattr__(name):
    # GEMV / skinny GEMM ops live in their own modules, loaded on first use
    import importlib
    for mod in ("gemv", "skinny", "int_quant"):
        try:
            m = importlib.import_module(f"rocjit.ops.{mod}")
        except ImportError:
            continue
        if hasattr(m, name):
            return getattr(m, name)
    raise AttributeError(f"module 'rocjit.ops' has no attribute {name!r}")
