"""A kernel's parameters read from its source: pointer vs scalar, pointee / scalar C type, const-ness.

The binary says where each parameter lives (offset, size); the source says what it means. Both are read
and cross-checked by rocjit.kernel.
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass

# C type (as written) -> the element dtypes a pointer to it accepts; `None` = any dtype.
_BYTE_FP8 = ("uint8", "bool", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
POINTEE_DTYPES = {
    "__half": ("float16",), "half": ("float16",), "_Float16": ("float16",), "__fp16": ("float16",),
    "__half2": ("float16",), "half2": ("float16",),
    "__hip_bfloat16": ("bfloat16",), "hip_bfloat16": ("bfloat16",), "__nv_bfloat16": ("bfloat16",),
    "__bf16": ("bfloat16",), "bfloat16": ("bfloat16",), "__hip_bfloat162": ("bfloat16",), "__nv_bfloat162": ("bfloat16",),
    "float": ("float32",), "float2": ("float32",), "float4": ("float32",),
    "double": ("float64",), "double2": ("float64",),
    "int": ("int32",), "int32_t": ("int32",), "int2": ("int32",), "int4": ("int32",),
    "unsigned": ("uint32",), "unsigned int": ("uint32",), "uint32_t": ("uint32",),
    "short": ("int16",), "int16_t": ("int16",), "unsigned short": ("uint16",), "uint16_t": ("uint16",),
    "long": ("int64",), "long long": ("int64",), "int64_t": ("int64",),
    "unsigned long": ("uint64",), "unsigned long long": ("uint64",), "uint64_t": ("uint64",), "size_t": ("uint64",),
    "signed char": ("int8",), "int8_t": ("int8",), "char4": ("int8",),
    "char": ("int8", "uint8"),
    "unsigned char": _BYTE_FP8, "uint8_t": _BYTE_FP8, "uchar4": _BYTE_FP8,
    "bool": ("bool",),
    "__hip_fp8_e4m3": ("float8_e4m3fn",), "__nv_fp8_e4m3": ("float8_e4m3fn",),
    "__hip_fp8_e4m3_fnuz": ("float8_e4m3fnuz",), "__hip_fp8_e5m2": ("float8_e5m2",), "__nv_fp8_e5m2": ("float8_e5m2",),
    "void": None, "uint2": None, "uint4": None,
}
# Vector pointee types: the pointer must be aligned to the vector's size.
POINTEE_ALIGN = {"float2": 8, "float4": 16, "double2": 16, "int2": 8, "int4": 16, "uint2": 8, "uint4": 16,
                 "__half2": 4, "half2": 4, "__hip_bfloat162": 4, "__nv_bfloat162": 4, "char4": 4, "uchar4": 4}

# Scalar C type -> (ctypes type, kind) used to pack a Python / numpy scalar.
SCALAR_CTYPES = {
    "int": ctypes.c_int32, "int32_t": ctypes.c_int32, "unsigned": ctypes.c_uint32, "unsigned int": ctypes.c_uint32,
    "uint32_t": ctypes.c_uint32, "long": ctypes.c_int64, "long long": ctypes.c_int64, "int64_t": ctypes.c_int64,
    "unsigned long": ctypes.c_uint64, "unsigned long long": ctypes.c_uint64, "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_uint64, "short": ctypes.c_int16, "int16_t": ctypes.c_int16, "unsigned short": ctypes.c_uint16,
    "uint16_t": ctypes.c_uint16, "char": ctypes.c_int8, "signed char": ctypes.c_int8, "int8_t": ctypes.c_int8,
    "unsigned char": ctypes.c_uint8, "uint8_t": ctypes.c_uint8, "bool": ctypes.c_bool,
    "float": ctypes.c_float, "double": ctypes.c_double,
    # 16-bit floats travel as their bit pattern
    "__half": ctypes.c_uint16, "half": ctypes.c_uint16, "_Float16": ctypes.c_uint16,
    "__hip_bfloat16": ctypes.c_uint16, "hip_bfloat16": ctypes.c_uint16, "__nv_bfloat16": ctypes.c_uint16,
    "__bf16": ctypes.c_uint16,
}
HALF_TYPES = {"__half", "half", "_Float16"}
BF16_TYPES = {"__hip_bfloat16", "hip_bfloat16", "__nv_bfloat16", "__bf16"}

_ATTRIBUTES = {"__launch_bounds__", "__attribute__", "__declspec", "alignas", "__maxnreg__"}
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct", "__grid_constant__"}


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str            # base type with qualifiers removed, e.g. "__half"
    pointer: bool
    const: bool = False   # the pointee is const (nothing is written through it)
    text: str = ""        # as written in the source

    @property
    def dtypes(self):
        """Element dtypes a pointer parameter accepts (None = any)."""
        return POINTEE_DTYPES.get(self.ctype) if self.pointer else None

    def describe(self) -> str:
        return f"parameter {self.name!r} ({self.text.strip()})"


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    return re.sub(r"//[^\n]*", " ", src)


def _split_top(text: str, sep=","):
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return parts


def _template_params(prefix: str) -> list[str]:
    """Names of the template parameters in the `template <...>` right before a kernel."""
    # attributes and specifiers may stand between the template header and __global__
    prefix = re.sub(r"(__launch_bounds__|__attribute__)\s*\((?:[^()]|\([^()]*\))*\)", " ", prefix)
    prefix = re.sub(r"\b(static|inline|__forceinline__|extern\s*\"C\")\s*", " ", prefix)
    m = re.search(r"template\s*<(.*)>\s*$", prefix, re.S)
    if not m:
        return []
    names = []
    for part in _split_top(m.group(1)):
        part = part.split("=")[0].strip()
        names.append(part.split()[-1] if part.split() else "")
    return names


def _parse_param(text: str, index: int, subst: dict) -> Param:
    t = text.strip()
    t = re.sub(r"__attribute__\s*\(\(.*?\)\)", " ", t)
    pointer = "*" in t or "&" in t
    # name is the last identifier when the declaration has one beyond the type
    toks = re.findall(r"[A-Za-z_]\w*(?:::\w+)*|\*|&", t)
    name = f"arg{index}"
    words = [w for w in toks if w not in ("*", "&")]
    if toks and toks[-1] not in ("*", "&") and len(words) >= 2:
        name = toks[-1]
        words = words[:-1]
    before_star = t.split("*")[0] if pointer else t
    const = pointer and bool(re.search(r"\bconst\b", before_star))
    base = " ".join(w for w in words if w not in _QUALIFIERS)
    base = subst.get(base, base)
    base = re.sub(r"^(?:std|rocjit|hip)::", "", base)
    return Param(name, base, pointer, const, t)


def _skip_parens(src: str, i: int) -> int:
    """Index just past the ')' closing the '(' that ends right before `i`."""
    depth = 1
    while i < len(src) and depth:
        depth += {"(": 1, ")": -1}.get(src[i], 0)
        i += 1
    return i


def find_kernel(source: str, name: str | None):
    """[(kernel name, template prefix, param text)] for __global__ functions (all, or the one named)."""
    src = _strip_comments(source)
    out = []
    for m in re.finditer(r"__global__", src):
        pos, kname = m.end(), None
        while True:   # the first `identifier (` that is not an attribute such as __launch_bounds__(256)
            sig = re.compile(r"[^;{}()]*?\b([A-Za-z_]\w*)\s*\(").match(src, pos)
            if not sig:
                break
            if sig.group(1) in _ATTRIBUTES:
                pos = _skip_parens(src, sig.end())
                continue
            kname = sig.group(1)
            break
        if kname is None:
            continue
        start = sig.end()
        params = src[start:_skip_parens(src, start) - 1]
        prefix = src[max(0, m.start() - 400):m.start()]
        prefix = prefix.split(";")[-1].split("}")[-1]
        if name is None or kname == name:
            out.append((kname, prefix, params))
    return out


def parse(source: str, name_expression: str) -> list[Param] | None:
    """Parameters of the kernel `name_expression` ("saxpy" or "scale<__half, 8>"), or None if not found."""
    base = name_expression.split("<")[0].strip().split("::")[-1]
    targs = []
    if "<" in name_expression:
        targs = [a.strip() for a in _split_top(name_expression[name_expression.index("<") + 1:name_expression.rindex(">")])]
    found = find_kernel(source, base)
    if not found:
        return None
    _, prefix, params = found[0]
    subst = dict(zip(_template_params(prefix), targs))
    if params.strip() in ("", "void"):
        return []
    return [_parse_param(p, i, subst) for i, p in enumerate(_split_top(params))]
