"""A kernel's parameters read from its source: pointer vs scalar, pointee / scalar C type, const-ness.

The binary says where each parameter lives (offset, size); the source says what it means. Both are read
and cross-checked by rocjit.launch.params. The reader knows C's spellings of the built-in types, object-like
macros, template arguments and namespaces; it does not preprocess (#if), so the code object has the last word.
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
    "ptrdiff_t": ("int64",), "intptr_t": ("int64",), "uintptr_t": ("uint64",), "ssize_t": ("int64",),
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
    "size_t": ctypes.c_uint64, "ptrdiff_t": ctypes.c_int64, "intptr_t": ctypes.c_int64, "uintptr_t": ctypes.c_uint64,
    "ssize_t": ctypes.c_int64, "short": ctypes.c_int16, "int16_t": ctypes.c_int16, "unsigned short": ctypes.c_uint16,
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
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct", "class", "enum",
               "__grid_constant__", "ROCJIT_GRID_CONSTANT", "typename"}
_INT_WORDS = {"signed", "unsigned", "short", "long", "int", "char"}
# a pointer to pointers (T**, T* x[]) is an array of device addresses
POINTER_ARRAY_DTYPES = ("int64", "uint64")


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
        if not self.pointer:
            return None
        return POINTER_ARRAY_DTYPES if self.ctype.endswith("*") else POINTEE_DTYPES.get(self.ctype)

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


def _canonical_type(words: list[str]) -> str:
    """One spelling per built-in integer type: 'long int' -> 'long', 'unsigned long long int' -> 'unsigned long
    long', 'signed' -> 'int', 'short int' -> 'short'; any other type as written."""
    if not words or not set(words) <= _INT_WORDS:
        return " ".join(words)
    sign = "unsigned " if "unsigned" in words else ""
    if "char" in words:
        return "unsigned char" if sign else ("signed char" if "signed" in words else "char")
    if "short" in words:
        return sign + "short"
    longs = words.count("long")
    return sign + ("long long" if longs >= 2 else "long" if longs == 1 else "int")


def _expand_macros(text: str, macros: dict) -> str:
    for _ in range(8):      # nested object-like macros, with a bound against self-reference
        expanded = re.sub(r"[A-Za-z_]\w*", lambda m: macros.get(m.group(0), m.group(0)), text)
        if expanded == text:
            break
        text = expanded
    return text


def _parse_param(text: str, index: int, subst: dict, macros: dict | None = None) -> Param:
    written = text.strip()
    t = _expand_macros(written, macros) if macros else written
    t = re.sub(r"\[\[.*?\]\]", " ", t)                                   # [[maybe_unused]] and co
    t = re.sub(r"\b(__attribute__|__declspec|alignas)\s*\((?:[^()]|\([^()]*\))*\)", " ", t)
    t = _split_top(t, "=")[0] if _split_top(t, "=") else t              # a default argument
    array = re.search(r"\[[^\]]*\]\s*$", t)                              # T x[N] is a T* in a parameter list
    if array:
        t = t[:array.start()]
    stars = t.count("*") + (1 if array else 0)
    pointer = stars > 0 or "&" in t
    # name is the last identifier when the declaration has one beyond the type
    toks = re.findall(r"[A-Za-z_]\w*(?:::\w+)*|\*|&", t)
    name = f"arg{index}"
    words = [w for w in toks if w not in ("*", "&")]
    if toks and toks[-1] not in ("*", "&") and len(words) >= 2 and not (set(words) <= _INT_WORDS and
                                                                         words[-1] in ("int", "long", "char", "short")):
        name = toks[-1]
        words = words[:-1]
    before_star = t.split("*")[0] if pointer else t
    const = pointer and bool(re.search(r"\bconst\b", before_star))
    base = " ".join(w for w in words if w not in _QUALIFIERS)
    base = subst.get(base, base)
    base = re.sub(r"^(?:std|rocjit|hip)::", "", base)
    base = _canonical_type(base.split())
    if stars > 1:
        base += "*" * (stars - 1)
    return Param(name, base, pointer, const, written)


def _skip_parens(src: str, i: int) -> int:
    """Index just past the ')' closing the '(' that ends right before `i`."""
    depth = 1
    while i < len(src) and depth:
        depth += {"(": 1, ")": -1}.get(src[i], 0)
        i += 1
    return i


def _namespaces_at(src: str, positions: list[int]) -> list[tuple[str, ...]]:
    """The enclosing namespace path at each position (sorted ascending)."""
    out, stack, events = [], [], re.finditer(r"\bnamespace\s+([A-Za-z_][\w:]*)?\s*\{|[{}]", src)
    pending = iter(positions)
    pos = next(pending, None)
    for ev in events:
        while pos is not None and pos < ev.start():
            out.append(tuple(n for names in stack if names for n in names))
            pos = next(pending, None)
        if ev.group(0) == "}":
            if stack:
                stack.pop()
        elif ev.group(0) == "{":
            stack.append(None)
        else:       # namespace a::b { ... } opens both; an anonymous one adds no name
            stack.append(tuple((ev.group(1) or "").split("::")) if ev.group(1) else None)
    while pos is not None:
        out.append(tuple(n for names in stack if names for n in names))
        pos = next(pending, None)
    return out


def find_kernels(source: str):
    """[(namespace path, kernel name, template prefix, param text)] of every __global__ function."""
    src = _strip_comments(source)
    found = []
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
        found.append((m.start(), kname, prefix, params))
    spaces = _namespaces_at(src, [f[0] for f in found])
    return [(ns, kname, prefix, params) for ns, (_, kname, prefix, params) in zip(spaces, found)]


def find_kernel(source: str, name: str | None):
    """[(kernel name, template prefix, param text)] for __global__ functions (all, or the one named)."""
    return [(k, prefix, params) for _, k, prefix, params in find_kernels(source) if name is None or k == name]


def _macros(source: str, defines) -> dict:
    """Object-like macros: the source's own #defines, then the defines the module is compiled with."""
    macros = {}
    for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)\b(?!\()[ \t]*(.*)$", _strip_comments(source), re.M):
        macros[m.group(1)] = m.group(2).strip()
    for k, v in dict(defines or {}).items():
        macros[str(k)] = "1" if v is None or v is True else str(int(v) if isinstance(v, bool) else v)
    return macros


def parse(source: str, name_expression: str, defines=None) -> list[Param] | None:
    """Parameters of the kernel `name_expression` ("saxpy", "ns::saxpy" or "scale<__half, 8>"), or None if not
    found. An unqualified name means the global namespace's kernel, else the only one of that name."""
    qualified = name_expression.split("<")[0].strip()
    parts = qualified.split("::")
    base, space = parts[-1].strip(), tuple(p.strip() for p in parts[:-1] if p.strip())
    targs = []
    if "<" in name_expression:
        targs = [a.strip() for a in _split_top(name_expression[name_expression.index("<") + 1:name_expression.rindex(">")])]
    found = [k for k in find_kernels(source) if k[1] == base]
    if len(parts) > 1:
        found = [k for k in found if k[0] == space]
    elif len({k[0] for k in found}) > 1:
        top = [k for k in found if k[0] == ()]
        if not top:
            where = ", ".join("::".join(k[0] + (base,)) for k in found)
            raise ValueError(f"kernel name {base!r} is ambiguous ({where}); qualify it with its namespace")
        found = top
    if not found:
        return None
    _, _, prefix, params = found[0]
    subst = dict(zip(_template_params(prefix), targs))
    macros = _macros(source, defines)
    if _expand_macros(params, macros).strip() in ("", "void"):
        return []
    return [_parse_param(p, i, subst, macros) for i, p in enumerate(_split_top(params))]
