"""AMD backend: hipRTC compile -> code object (hsaco); hip-python module load and launch.

hip-python is imported on first use. Code-object reading (ELF sections, symbols and the
amdhsa msgpack metadata note) is plain Python here, so it works without ROCm or a GPU.
"""
from __future__ import annotations

import ctypes
import functools
import os
import re
import struct
import threading
from dataclasses import dataclass

from rocjit.errors import CompileError, LaunchError, PlatformError
from rocjit.platform import Compiled

NAME = "hip"


# ----------------------------------------------------------------------------------------
# Locating the HIP libraries. hip-python dlopens the unversioned libamdhip64.so / libhiprtc.so;
# distributions ship versioned sonames only (and ROCm 5.x keeps hipRTC inside libamdhip64),
# so the resolver is taught those names before the first binding call.

_LIB_MAJORS = (7, 6, 5)


def _can_dlopen(name: str) -> bool:
    try:
        ctypes.CDLL(name)
        return True
    except OSError:
        return False


def _has_symbol(name: str, symbol: str) -> bool:
    try:
        return hasattr(ctypes.CDLL(name), symbol)
    except OSError:
        return False


def _fallback_library(shortname: str) -> str | None:
    """A loadable versioned soname for 'amdhip64' or 'hiprtc', or None."""
    if shortname == "amdhip64":
        for major in _LIB_MAJORS:
            if _can_dlopen(f"libamdhip64.so.{major}"):
                return f"libamdhip64.so.{major}"
    if shortname == "hiprtc":
        for major in _LIB_MAJORS:
            if _can_dlopen(f"libhiprtc.so.{major}"):
                return f"libhiprtc.so.{major}"
        # ROCm 5.x: hipRTC is exported by the HIP runtime library itself.
        for major in _LIB_MAJORS:
            if _has_symbol(f"libamdhip64.so.{major}", "hiprtcCreateProgram"):
                return f"libamdhip64.so.{major}"
    return None


_loader_patched = False


def _teach_loader():
    """Make hip-python resolve libraries through `_library_path` (idempotent)."""
    global _loader_patched
    if _loader_patched:
        return
    try:
        from rocm.bindings.util import paths
    except ImportError:   # an older hip-python: it relies on the system loader only
        _loader_patched = True
        return
    original = paths.get_library_path

    def resolve(shortname, *args, **kwargs):
        if shortname in ("amdhip64", "hiprtc") and not args and not kwargs:
            return os.fsencode(_library_path(shortname))
        return original(shortname, *args, **kwargs)

    # _library_path asks the original resolver first, so keep a handle on it.
    paths._rocjit_original_get_library_path = original
    paths.get_library_path = resolve
    _loader_patched = True


def _bindings():
    """(hip, hiprtc) modules of hip-python, with the library resolver prepared."""
    _teach_loader()
    try:
        from hip import hip, hiprtc
    except ImportError as e:
        raise PlatformError(f"hip-python is not installed ({e}); install it with: pip install 'rocjit[rocm]'") from e
    return hip, hiprtc


@functools.lru_cache(maxsize=None)
def _library_path(shortname: str) -> str:
    """The path or soname to dlopen for 'amdhip64' / 'hiprtc': hip-python's own answer
    when it is loadable, else a versioned soname the system loader finds."""
    try:
        from rocm.bindings.util import paths
        resolver = getattr(paths, "_rocjit_original_get_library_path", paths.get_library_path)
        found = os.fsdecode(resolver(shortname))
    except ImportError:
        found = f"lib{shortname}.so"
    if os.path.isabs(found) or _can_dlopen(found):
        return found
    return _fallback_library(shortname) or found


def _ok(result, what: str):
    """Unpack a hip-python result tuple `(err, values...)`, raising on an error code."""
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if int(err) != 0:
        raise LaunchError(f"{what} failed", error_name(err))
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def error_name(code) -> str:
    name = getattr(code, "name", None)
    if name:
        return name
    try:
        hip, _ = _bindings()
        return hip.hipError_t(int(code)).name
    except Exception:
        return f"hipError {int(code)}"


# ----------------------------------------------------------------------------------------
# Availability

@functools.lru_cache(maxsize=None)
def _probe() -> tuple[bool, str]:
    try:
        hip, _ = _bindings()
    except PlatformError as e:
        return False, str(e)
    try:
        result = hip.hipGetDeviceCount()
    except RuntimeError as e:   # the runtime library could not be dlopened
        return False, f"the HIP runtime library is not loadable ({e})"
    err, count = result[0], result[1]
    if int(err) != 0:
        return False, f"no AMD GPU visible (hipGetDeviceCount: {getattr(err, 'name', err)})"
    if count == 0:
        return False, "no AMD GPU visible (hipGetDeviceCount returned 0)"
    return True, ""


def is_available() -> bool:
    return _probe()[0]


def unavailable_reason() -> str:
    ok, reason = _probe()
    return "" if ok else reason


@functools.lru_cache(maxsize=None)
def hiprtc_status() -> tuple[bool, str]:
    """(usable, detail): can hipRTC compile here (no GPU needed)?"""
    try:
        _, hiprtc = _bindings()
    except PlatformError as e:
        return False, str(e)
    try:
        result = hiprtc.hiprtcVersion()
    except RuntimeError as e:
        return False, f"libhiprtc is not loadable ({e}); on Debian 12: apt-get install libamdhip64-5 libamd-comgr2 rocm-device-libs libhiprtc-builtins5"
    if int(result[0]) != 0:
        return False, f"hiprtcVersion failed: {result[0]}"
    return True, _library_path("hiprtc")


def hiprtc_usable() -> bool:
    return hiprtc_status()[0]


@functools.lru_cache(maxsize=None)
def compiler_version() -> str:
    """hipRTC's version, read from the HIP runtime it ships with (e.g. 'hiprtc 5.2.21153')."""
    hip, hiprtc = _bindings()
    try:
        version = _ok(hip.hipRuntimeGetVersion(), "hipRuntimeGetVersion")
    except (LaunchError, RuntimeError):
        major, minor = _ok(hiprtc.hiprtcVersion(), "hiprtcVersion")
        return f"hiprtc {major}.{minor} ({_library_path('hiprtc')})"
    # HIP_VERSION = major * 10_000_000 + minor * 100_000 + patch
    return f"hiprtc {version // 10_000_000}.{version // 100_000 % 100}.{version % 100_000}"


# ----------------------------------------------------------------------------------------
# Compile (hipRTC)

def _has_std(options) -> bool:
    return any(str(o).startswith(("-std=", "--std=")) for o in options)


def compile(source: str, *, target: str, options=(), include_dirs=(), name_expressions=(),
            filename: str = "<source>") -> Compiled:
    """hipRTC: source -> hsaco for `target` (e.g. 'gfx90a'). Name expressions are lowered."""
    _, hiprtc = _bindings()
    if not hiprtc_usable():
        raise PlatformError(f"hipRTC is not usable: {hiprtc_status()[1]}")
    opts = [f"--offload-arch={target}", "-O3"]
    if not _has_std(options):
        opts.append("-std=c++17")
    opts += [f"-I{d}" for d in include_dirs] + [str(o) for o in options]
    with _hiprtc_lock:
        return _compile_locked(hiprtc, source, target, opts, name_expressions, filename)


# hipRTC (comgr) in ROCm 5.x is not documented as thread-safe: one program at a time.
_hiprtc_lock = threading.Lock()


def _compile_locked(hiprtc, source, target, opts, name_expressions, filename) -> Compiled:
    prog = _ok(hiprtc.hiprtcCreateProgram(source.encode(), os.path.basename(filename).encode(), 0, [], []),
               "hiprtcCreateProgram")
    try:
        for expr in name_expressions:
            _ok(hiprtc.hiprtcAddNameExpression(prog, expr.encode()), f"hiprtcAddNameExpression({expr!r})")
        encoded = [o.encode() for o in opts]
        status = hiprtc.hiprtcCompileProgram(prog, len(encoded), encoded)[0]
        # hipRTC (comgr) names the source 'CompileSource' in a temp dir: show the caller's name.
        log = re.sub(r"\S*/input/CompileSource\b", lambda _: filename, _program_log(hiprtc, prog))
        if int(status) != 0:
            raise CompileError(log or str(status), source, filename, target, compiler_version())
        size = _ok(hiprtc.hiprtcGetCodeSize(prog), "hiprtcGetCodeSize")
        code = bytearray(size)
        _ok(hiprtc.hiprtcGetCode(prog, code), "hiprtcGetCode")
        lowered = {}
        for expr in name_expressions:
            name = _ok(hiprtc.hiprtcGetLoweredName(prog, expr.encode()), f"hiprtcGetLoweredName({expr!r})")
            lowered[expr] = name.decode() if isinstance(name, bytes) else str(name)
    finally:
        hiprtc.hiprtcDestroyProgram(prog.createRef())   # the C API takes hiprtcProgram*
    return Compiled(binary=bytes(code), format="hsaco", target=target, lowered=lowered, log=log)


def _program_log(hiprtc, prog) -> str:
    size = _ok(hiprtc.hiprtcGetProgramLogSize(prog), "hiprtcGetProgramLogSize")
    if not size:
        return ""
    buf = bytearray(size)
    _ok(hiprtc.hiprtcGetProgramLog(prog, buf), "hiprtcGetProgramLog")
    return bytes(buf).rstrip(b"\0").decode(errors="replace")


# ----------------------------------------------------------------------------------------
# Code objects: ELF64 sections, symbols, relocations and the amdhsa metadata note.

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
        raise PlatformError("reading AMD code-object metadata needs msgpack: pip install msgpack") from e
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


def param_layout(binary: bytes, module=None, fn=None, mangled: str | None = None, count: int | None = None):
    """[(offset, size)] of the explicit kernel arguments, from the code-object metadata."""
    try:
        meta = kernel_metadata(binary, mangled)
    except (KeyError, ValueError):
        return None
    if isinstance(meta, list):   # no name given: only unambiguous for a single kernel
        if len(meta) != 1:
            return None
        meta = meta[0]
    args = meta.get(".args")
    if args is None:
        return None
    return [(a[".offset"], a[".size"]) for a in args
            if not str(a.get(".value_kind", "")).startswith("hidden_")]


# ----------------------------------------------------------------------------------------
# Devices, modules and launches (hip-python; needs ROCm and an AMD GPU)

def _require():
    if not is_available():
        raise PlatformError(f"no usable AMD GPU: {unavailable_reason()}")
    return _bindings()[0]


def device_count() -> int:
    if not is_available():
        return 0
    hip = _bindings()[0]
    return _ok(hip.hipGetDeviceCount(), "hipGetDeviceCount")


@functools.lru_cache(maxsize=None)
def _properties(dev: int):
    hip = _require()
    return _ok(hip.hipGetDeviceProperties(dev), "hipGetDeviceProperties")


def _text(value) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).split(b"\0", 1)[0].decode(errors="replace")
    return str(value)


def device_name(dev: int) -> str:
    return _text(_properties(dev).name)


def device_target(dev: int) -> str:
    """'gfx942' from gcnArchName 'gfx942:sramecc+:xnack-' (feature flags dropped)."""
    return _text(_properties(dev).gcnArchName).split(":", 1)[0]


@functools.lru_cache(maxsize=None)
def device_attributes(dev: int) -> dict:
    hip = _require()
    attr = hip.hipDeviceAttribute_t

    def get(name):
        return _ok(hip.hipDeviceGetAttribute(getattr(attr, name), dev), name)

    cus = get("hipDeviceAttributeMultiprocessorCount")
    return {
        "name": device_name(dev),
        "target": device_target(dev),
        "sm_count": cus,
        "cu_count": cus,
        "warp_size": get("hipDeviceAttributeWarpSize"),
        "l2_bytes": get("hipDeviceAttributeL2CacheSize"),
        "max_shared_per_block": get("hipDeviceAttributeMaxSharedMemoryPerBlock"),
        "max_shared_per_block_optin": get("hipDeviceAttributeSharedMemPerBlockOptin") or
                                      get("hipDeviceAttributeMaxSharedMemoryPerBlock"),
        "max_threads_per_block": get("hipDeviceAttributeMaxThreadsPerBlock"),
    }


def set_current(dev: int):
    hip = _require()
    _ok(hip.hipSetDevice(dev), f"hipSetDevice({dev})")


_previous = threading.local()


def push_current(dev: int) -> bool:
    """Make `dev` current for a launch; True when the caller's device must be restored with pop_current()."""
    hip = _require()
    prev = int(_ok(hip.hipGetDevice(), "hipGetDevice"))
    if prev == dev:
        return False
    _previous.__dict__.setdefault("stack", []).append(prev)
    set_current(dev)
    return True


def pop_current() -> None:
    set_current(_previous.stack.pop())


def load_module(binary: bytes, dev: int):
    """hipModuleLoadData on device `dev` (the caller made it current with push_current)."""
    hip = _require()
    return _ok(hip.hipModuleLoadData(binary), "hipModuleLoadData")


@dataclass
class Function:
    """A kernel handle: hip-python's object plus its raw address for the ctypes launch path."""
    handle: object
    ptr: int
    name: str


def get_function(module, mangled: str) -> Function:
    hip = _require()
    handle = _ok(hip.hipModuleGetFunction(module, mangled.encode()), f"hipModuleGetFunction({mangled!r})")
    return Function(handle, int(handle), mangled)


def function_info(fn: Function) -> dict:
    hip = _require()
    a = hip.hipFunction_attribute

    def get(name):
        return _ok(hip.hipFuncGetAttribute(getattr(a, name), fn.handle), name)

    return {
        "num_regs": get("HIP_FUNC_ATTRIBUTE_NUM_REGS"),
        "shared_bytes": get("HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES"),
        "local_bytes": get("HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES"),
        "max_threads": get("HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
    }


def set_max_dynamic_shared(fn: Function, nbytes: int):
    """AMD launches may use the device's whole LDS without opting in; the attribute is set where
    the runtime supports it for module functions, and a request above the LDS size is an error."""
    hip = _require()
    dev = _ok(hip.hipGetDevice(), "hipGetDevice")
    limit = device_attributes(dev)["max_shared_per_block_optin"]
    if nbytes > limit:
        raise LaunchError(f"dynamic shared memory of {nbytes} bytes requested for {fn.name}, "
                          f"the device allows at most {limit} bytes per workgroup")
    try:
        hip.hipFuncSetAttribute(fn.handle, hip.hipFuncAttribute.hipFuncAttributeMaxDynamicSharedMemorySize, nbytes)
    except Exception:   # module functions are not registered with the runtime API on every ROCm
        pass


@functools.lru_cache(maxsize=None)
def _runtime_lib():
    """The same HIP runtime hip-python uses, for the ctypes launch fast path."""
    lib = ctypes.CDLL(_library_path("amdhip64"))
    f = lib.hipModuleLaunchKernel
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    return lib


def _dims(d) -> tuple[int, int, int]:
    if isinstance(d, int):
        return (d, 1, 1)
    d = tuple(int(x) for x in d)
    return d + (1,) * (3 - len(d))


def launch(fn: Function, grid, block, shared_mem, stream, kernel_params) -> int:
    """hipModuleLaunchKernel with `kernel_params` (ctypes array of void*, one per parameter).
    Returns HIP's error code (0 on success); the caller raises LaunchError with error_name(code)."""
    gx, gy, gz = _dims(grid)
    bx, by, bz = _dims(block)
    return _runtime_lib().hipModuleLaunchKernel(fn.ptr, gx, gy, gz, bx, by, bz, int(shared_mem),
                                                int(stream or 0), ctypes.addressof(kernel_params), None)


def malloc(nbytes: int, dev: int) -> int:
    hip = _require()
    return int(_ok(hip.hipMalloc(max(int(nbytes), 1)), "hipMalloc"))


def free(ptr: int):
    hip = _require()
    _ok(hip.hipFree(ptr), "hipFree")


def memcpy_htod(dst: int, src_ptr: int, n: int):
    hip = _require()
    _ok(hip.hipMemcpyHtoD(dst, src_ptr, n), "hipMemcpyHtoD")


def memcpy_dtoh(dst_ptr: int, src: int, n: int):
    hip = _require()
    _ok(hip.hipMemcpyDtoH(dst_ptr, src, n), "hipMemcpyDtoH")


def synchronize(dev: int):
    hip = _require()
    set_current(dev)
    _ok(hip.hipDeviceSynchronize(), "hipDeviceSynchronize")


def check_last(dev: int):
    hip = _require()
    set_current(dev)
    err = hip.hipGetLastError()
    err = err[0] if isinstance(err, tuple) else err
    if int(err) != 0:
        raise LaunchError("a kernel launch failed", error_name(err))


def pointer_device(ptr: int) -> int | None:
    """Device ordinal owning `ptr`, or None for host memory (unregistered or pinned)."""
    hip = _require()
    result = hip.hipPointerGetAttributes(ptr)
    if int(result[0]) != 0:   # unregistered host memory is reported as an invalid value
        hip.hipGetLastError()  # clear the sticky error the failed query leaves behind
        return None
    attrs = result[1]
    kind = int(getattr(attrs, "type", getattr(attrs, "memoryType", -1)))
    if kind in (int(hip.hipMemoryType.hipMemoryTypeDevice), int(hip.hipMemoryType.hipMemoryTypeManaged)):
        return int(attrs.device)
    return None
