"""Target names: whether a target is NVIDIA's or AMD's is decided here and nowhere else.

A name is checked before any vendor library sees it: hipRTC 5.2 aborts the process on a target it does not know.
"""
from __future__ import annotations

import re

_NVIDIA = re.compile(r"(sm|compute)_\d{2,3}[af]?")
_AMD = re.compile(r"gfx\d{2,3}[0-9a-f]")
# AMD GPUs by ISA name (LLVM's AMDGPU processor list, GCN3 onwards): a well-formed name outside it is a typo
AMD_TARGETS = ("gfx803", "gfx900", "gfx902", "gfx904", "gfx906", "gfx908", "gfx909", "gfx90a", "gfx90c",
               "gfx940", "gfx941", "gfx942", "gfx950", "gfx1010", "gfx1011", "gfx1012", "gfx1013",
               "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036",
               "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1200", "gfx1201")
EXAMPLES = "sm_90a, compute_90, gfx90a, gfx942, gfx950"


def vendor(target) -> str:
    """'cuda' for sm_XX / compute_XX, 'hip' for gfxNNN; ValueError naming the target otherwise."""
    if isinstance(target, str):
        if _NVIDIA.fullmatch(target):
            return "cuda"
        if _AMD.fullmatch(target):
            return "hip"
    raise ValueError(f"target {target!r} is neither an NVIDIA sm_XX / compute_XX nor an AMD gfxNNN target "
                     f"(examples: {EXAMPLES})")


def is_nvidia(target: str) -> bool:
    return vendor(target) == "cuda"


def wave_size(target: str) -> int:
    """Threads per wave: 32 on NVIDIA and on RDNA (gfx10 and later compile wave32 by default), 64 on GCN / CDNA."""
    if vendor(target) == "cuda":
        return 32
    major = int(target[3:-2])          # gfx90a -> 9, gfx942 -> 9, gfx1100 -> 11: the last two characters are minor
    return 32 if major >= 10 else 64


def is_ptx(target: str) -> bool:
    """compute_XX: NVRTC returns PTX text instead of a cubin."""
    return vendor(target) == "cuda" and target.startswith("compute_")


def nvidia_arch(target: str) -> int:
    """The compute capability of an NVIDIA target as one number (sm_90a -> 90, compute_89 -> 89); 0 for AMD."""
    return int(re.sub(r"\D", "", target)) if vendor(target) == "cuda" else 0


def has_programmatic_launch(target: str) -> bool:
    """NVIDIA sm_90 and later: a kernel may be launched to overlap the one ahead of it in its stream
    (programmatic dependent launch). HIP has no equivalent."""
    return nvidia_arch(target) >= 90
