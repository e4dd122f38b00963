"""rocjit's kernel library: fused memory-bound inference ops and GEMV / skinny GEMM.

Each op takes torch tensors (or cupy / numpy arrays, returned in kind), compiles its kernel on first use and
launches on the current stream; a repeated eager call with the same shapes replays a native plan (a raw launch's
host cost); torch.compile traces them as torch.ops.rocjit.* custom ops. Every op is listed in
``rocjit.ops.REGISTRY`` (rocjit/ops/_op.py), which these public names are read from.
"""
import sys as _sys

from rocjit.ops._op import REGISTRY, clear_plans, load_all as _load_all, register_custom_ops

_load_all()
globals().update({_name: _entry.function for _name, _entry in REGISTRY.items()})
from rocjit.ops.skinny import prepare_gate_up  # noqa: E402  (one-time weight preparation of skinny_gemm_swiglu)

if "torch" in _sys.modules:  # torch is already loaded: register the custom ops for torch.compile now
    register_custom_ops()

__all__ = sorted(REGISTRY) + ["REGISTRY", "clear_plans", "prepare_gate_up", "register_custom_ops"]


def __getattr__(name):
    # int4 / int8 packing helpers live in rocjit.ops.int_quant, loaded on first use
    import importlib
    m = importlib.import_module("rocjit.ops.int_quant")
    if name in getattr(m, "__all__", ()) or (not name.startswith("_") and hasattr(m, name)):
        return getattr(m, name)
    raise AttributeError(f"module 'rocjit.ops' has no attribute {name!r}")
