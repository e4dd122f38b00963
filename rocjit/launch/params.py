"""One ParamSpec per kernel and target: the parameters as the source declares them (rocjit.signature) checked
against the code object's own record of them (rocjit.codeobject), before anything is launched. Every launch path
packs arguments by it: the general path (ctypes slots), the generated Python launcher (a struct format) and the
native launcher (the description it is built from)."""
from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass

from rocjit import signature
from rocjit.errors import RocjitError

POINTER_SIZE = 8
# ctypes type -> struct module code (the native launcher speaks the same codes)
_CODES = {ctypes.c_int8: "b", ctypes.c_uint8: "B", ctypes.c_int16: "h", ctypes.c_uint16: "H",
          ctypes.c_int32: "i", ctypes.c_uint32: "I", ctypes.c_int64: "q", ctypes.c_uint64: "Q",
          ctypes.c_float: "f", ctypes.c_double: "d", ctypes.c_bool: "?"}
INT_RANGES = {code: (-2 ** (8 * struct.calcsize(code) - 1), 2 ** (8 * struct.calcsize(code) - 1) - 1)
              for code in "bhiq"} | {code: (0, 2 ** (8 * struct.calcsize(code)) - 1) for code in "BHIQ"}


@dataclass(frozen=True)
class Slot:
    """One parameter in the parameter block."""
    param: signature.Param
    offset: int
    size: int
    code: str | None          # "P" pointer, a struct code for a plain scalar, None for raw bytes (structs, 16-bit floats)
    ctype: type               # ctypes storage for the general path

    @property
    def pointer(self) -> bool:
        return self.param.pointer

    @property
    def raw(self) -> bool:
        """A by-value struct (e.g. a TMA tensor map): the launch copies the caller's bytes of exactly its size."""
        return self.code is None and self.param.ctype not in signature.HALF_TYPES | signature.BF16_TYPES


@dataclass(frozen=True)
class ParamSpec:
    kernel: str
    slots: tuple[Slot, ...]
    block_size: int
    from_binary: bool         # offsets and sizes read from the code object (else: C's natural layout)

    @classmethod
    def build(cls, kernel: str, params: list[signature.Param], layout) -> "ParamSpec":
        """`layout`: [(offset, size)] from the code object, or None where it does not say (PTX)."""
        if layout is not None and len(layout) != len(params):
            raise RocjitError(f"kernel {kernel}: the source declares {len(params)} parameters but the compiled kernel "
                              f"has {len(layout)}; the parsed signature and the code object disagree (a macro or "
                              f"#if the parser cannot see?)")
        slots, end = [], 0
        for i, p in enumerate(params):
            ct = ctypes.c_void_p if p.pointer else signature.SCALAR_CTYPES.get(p.ctype)
            declared = POINTER_SIZE if p.pointer else (ctypes.sizeof(ct) if ct is not None else None)
            if layout is not None:
                offset, size = layout[i]
                if declared is not None and declared != size:
                    raise RocjitError(f"kernel {kernel}: {p.describe()} is {size} bytes in the compiled kernel, "
                                      f"{declared} by its declared type")
            elif declared is None:
                raise RocjitError(f"kernel {kernel}: cannot tell the size of {p.describe()}: the code object does not "
                                  f"record parameter sizes")
            else:
                size = declared
                offset = (end + size - 1) // size * size     # scalars are aligned to their size
            code = "P" if p.pointer else _CODES.get(ct)
            if not p.pointer and (ct is None or p.ctype in signature.HALF_TYPES | signature.BF16_TYPES):
                # structs, and 16-bit floats (their bit pattern, converted by the general path): raw bytes
                ct, code = ctypes.c_char * size, None
            slots.append(Slot(p, offset, size, code, ct))
            end = max(end, offset + size)
        return cls(kernel, tuple(slots), end, layout is not None)

    # ------------------------------------------------------------------ the general path
    def storage(self):
        """ctypes storage for each parameter and the void* array the driver reads them through."""
        values = [s.ctype() for s in self.slots]
        array = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        return values, array

    # ------------------------------------------------------------------ the fast paths
    @property
    def python_packable(self) -> bool:
        """Every parameter is a pointer, a plain scalar or a by-value struct: the generated launcher can pack it
        (structs as `bytes` of their exact size; 16-bit floats, which need converting, go the general path)."""
        return all(s.code is not None or s.raw for s in self.slots)

    def struct_format(self) -> str | None:
        """A struct module format placing each parameter at its offset (explicit padding, no implicit alignment),
        in parameter order, by-value structs as `<size>s`; None for a layout whose offsets do not increase with it
        or a parameter the generated launcher does not pack."""
        if not self.python_packable:
            return None
        fmt, at = "=", 0
        for s in self.slots:
            if s.offset < at:
                return None
            fmt += "x" * (s.offset - at) + ("Q" if s.code == "P" else s.code or f"{s.size}s")
            at = s.offset + s.size
        return fmt

    def native_params(self, dtype_code):
        """The native launcher's description: [(code, offset, alignment, (packed dtype, ...))], by-value structs as
        ("s", offset, size, ()) (passed as bytes of that size), or None where a pointer's dtypes are not ones the
        framework has or a parameter is a 16-bit float (converted by the general path). `dtype_code(name)` packs a
        dtype name, None if unknown."""
        if not self.python_packable:
            return None
        out = []
        for s in self.slots:
            if s.code is None:
                out.append(("s", s.offset, s.size, ()))
                continue
            if s.code != "P":
                out.append((s.code, s.offset, 1, ()))
                continue
            names = s.param.dtypes
            codes = () if names is None else tuple(c for c in map(dtype_code, names) if c is not None)
            if names is not None and not codes:
                return None
            out.append(("P", s.offset, signature.POINTEE_ALIGN.get(s.param.ctype, 1), codes))
        return out
