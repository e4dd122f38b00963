"""Reading code objects offline (no GPU, no vendor library): ELF64 sections, symbols, relocations and notes,
AMD's amdhsa metadata (msgpack note) and the kernel-parameter records NVIDIA keeps in a cubin's .nv.info sections.

inspect, the compilers and the launch path read code objects through this module alone.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from rocjit.errors import RocjitError

EM_CUDA, EM_AMDGPU = 190, 224


SHT_SYMTAB, SHT_NOTE, SHT_RELA, SHT_DYNSYM = 2, 7, 4, 11
NT_AMDGPU_METADATA = 32
STT_OBJECT, STT_FUNC = 1, 2


@dataclass(frozen=True)
class ElfSection:
    name: str
    type: int
    addr: int
    offset: int
    size: int
    link: int
    entsize: int


@dataclass(frozen=True)
class ElfSymbol:
    name: str
    value: int
    size: int
    type: int        # STT_*
    section: int


def _check_elf(binary: bytes):
    if len(binary) < 64 or binary[:4] != b"\x7fELF":
        raise ValueError("not an ELF code object (expected an AMDGPU hsaco or an NVIDIA cubin)")
    if binary[4] != 2 or binary[5] != 1:
        raise ValueError("only little-endian ELF64 code objects are supported")


def elf_machine(binary: bytes) -> tuple[int, int]:
    """(e_machine, e_flags): 224 is EM_AMDGPU, 190 EM_CUDA."""
    _check_elf(binary)
    return struct.unpack_from("<H", binary, 0x12)[0], struct.unpack_from("<I", binary, 0x30)[0]


def elf_sections(binary: bytes) -> list[ElfSection]:
    _check_elf(binary)
    shoff, = struct.unpack_from("<Q", binary, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", binary, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", binary, shoff + i * shentsize) for i in range(shnum)]
    names_off = raw[shstrndx][4] if shnum else 0
    sections = []
    for (name, typ, _flags, addr, offset, size, link, _info, _align, entsize) in raw:
        sections.append(ElfSection(_cstring(binary, names_off + name), typ, addr, offset, size, link, entsize))
    return sections


def _cstring(binary: bytes, offset: int) -> str:
    end = binary.index(b"\0", offset)
    return binary[offset:end].decode(errors="replace")


def elf_symbols(binary: bytes, dynamic: bool = False) -> list[ElfSymbol]:
    """Symbols of .symtab (or .dynsym), in table order."""
    sections = elf_sections(binary)
    wanted = SHT_DYNSYM if dynamic else SHT_SYMTAB
    out = []
    for sec in sections:
        if sec.type != wanted:
            continue
        strtab = sections[sec.link]
        for off in range(sec.offset, sec.offset + sec.size, sec.entsize or 24):
            name, info, _other, shndx, value, size = struct.unpack_from("<IBBHQQ", binary, off)
            out.append(ElfSymbol(_cstring(binary, strtab.offset + name), value, size, info & 0xF, shndx))
    return out


def elf_relocations(binary: bytes) -> list[tuple[int, int, int, int]]:
    """(r_offset, symbol index, type, addend) for every RELA entry."""
    out = []
    for sec in elf_sections(binary):
        if sec.type == SHT_RELA:
            for off in range(sec.offset, sec.offset + sec.size, sec.entsize or 24):
                r_offset, r_info, addend = struct.unpack_from("<QQq", binary, off)
                out.append((r_offset, r_info >> 32, r_info & 0xFFFFFFFF, addend))
    return out


def elf_notes(binary: bytes):
    """Yield (owner, type, desc bytes) of every note in every SHT_NOTE section."""
    for sec in elf_sections(binary):
        if sec.type != SHT_NOTE:
            continue
        pos, end = sec.offset, sec.offset + sec.size
        while pos + 12 <= end:
            namesz, descsz, typ = struct.unpack_from("<III", binary, pos)
            pos += 12
            owner = binary[pos:pos + namesz].rstrip(b"\0").decode(errors="replace")
            pos += (namesz + 3) & ~3
            desc = binary[pos:pos + descsz]
            pos += (descsz + 3) & ~3
            yield owner, typ, desc


def amdhsa_metadata(binary: bytes) -> dict:
    """The decoded `amdhsa.*` metadata (msgpack note 'AMDGPU', type 32) of a code object v3+."""
    try:
        import msgpack
    except ImportError as e:
        raise RocjitError("reading AMD code-object metadata needs msgpack: pip install msgpack") from e
    for owner, typ, desc in elf_notes(binary):
        if owner == "AMDGPU" and typ == NT_AMDGPU_METADATA:
            return msgpack.unpackb(desc, raw=False, strict_map_key=False)
    raise ValueError("the code object has no amdhsa metadata note (code object v2 is not supported)")


def kernel_metadata(binary: bytes, mangled: str | None = None):
    """The `amdhsa.kernels` entries, or the one whose .name (or .symbol) is `mangled`."""
    kernels = amdhsa_metadata(binary).get("amdhsa.kernels", [])
    if mangled is None:
        return kernels
    for k in kernels:
        if k.get(".name") == mangled or k.get(".symbol") in (mangled, mangled + ".kd"):
            return k
    names = ", ".join(k.get(".name", "?") for k in kernels)
    raise KeyError(f"kernel {mangled!r} is not in the code object (it has: {names})")


# ----------------------------------------------------------------------------------------
# NVIDIA: .nv.info.<kernel> attribute records (format byte, attribute byte, then a value)

EIFMT_SVAL = 4                    # a 16-bit size and that many bytes of payload follow
EIATTR_MAX_THREADS = 0x05
EIATTR_KPARAM_INFO = 0x17


def nv_info_records(binary: bytes, kernel: str):
    """Yield (attribute, payload) of every sized record in `.nv.info.<kernel>`."""
    for sec in elf_sections(binary):
        if sec.name != f".nv.info.{kernel}":
            continue
        data, i = binary[sec.offset:sec.offset + sec.size], 0
        while i + 4 <= len(data):
            fmt, attr, size = data[i], data[i + 1], int.from_bytes(data[i + 2:i + 4], "little")
            if fmt == EIFMT_SVAL:
                yield attr, data[i + 4:i + 4 + size]
                i += 4 + size
            else:          # EIFMT_NVAL / BVAL / HVAL: four bytes in all
                i += 4


def nv_kernels(binary: bytes) -> list[str]:
    """Kernel names that carry an .nv.info section."""
    return [s.name[len(".nv.info."):] for s in elf_sections(binary) if s.name.startswith(".nv.info.")]


def _cubin_layout(binary: bytes, kernel: str):
    params = {}
    for attr, payload in nv_info_records(binary, kernel):
        if attr == EIATTR_KPARAM_INFO and len(payload) >= 12:
            # u32 index, u16 ordinal, u16 offset, u32 flags whose bits 18..31 are the size in bytes
            _, ordinal, offset, flags = struct.unpack_from("<IHHI", payload)
            params[ordinal] = (offset, (flags >> 18) & 0x3FFF)
    if any(ordinal not in params for ordinal in range(len(params))):
        return None
    return [params[i] for i in range(len(params))]


def _amd_layout(binary: bytes, kernel: str):
    try:
        meta = kernel_metadata(binary, kernel)
    except KeyError:
        return None
    args = meta.get(".args")
    if args is None:
        return None
    return [(a[".offset"], a[".size"]) for a in args if not str(a.get(".value_kind", "")).startswith("hidden_")]


def param_layout(binary: bytes, kernel: str):
    """[(offset, size)] of each explicit parameter of `kernel` (its mangled name) as the compiler laid it out, or
    None where the code object does not say (PTX text, a kernel not in it, metadata without argument records)."""
    if binary[:4] != b"\x7fELF":
        return None
    machine, _ = elf_machine(binary)
    try:
        if machine == EM_AMDGPU:
            return _amd_layout(binary, kernel)
        if machine == EM_CUDA:
            if kernel not in nv_kernels(binary):
                return None
            return _cubin_layout(binary, kernel)
    except (ValueError, struct.error):       # a truncated or foreign ELF: no layout, the caller says so
        return None
    return None
