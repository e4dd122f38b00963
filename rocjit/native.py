"""The native extensions, built with the machine's compilers the first time they are needed and kept in the rocjit
cache like code objects (one build per Python, source and, for the second, torch):

- ``launcher.c``, the native launcher: it makes the common launch (framework tensors, Python scalars, the current
  stream) one C call; every other case goes to the Python launcher it wraps, so results and errors are the same
  with or without it. Where it cannot be built (no C compiler, no Python headers) launches use the Python launcher
  alone; ``python -m rocjit`` says which. ``ROCJIT_NATIVE_LAUNCH=0`` turns it off; ``ROCJIT_REQUIRE_NATIVE=1``
  makes a failed build an error (CI).
- ``torch_alloc.cpp``, the torch allocator of the eager op plans: ``Empty(prototype)(*sizes)`` is
  ``prototype.new_empty(sizes)`` through at::empty, without torch's Python argument parsing (about 0.6 µs less
  per output on an H100 / H200 host); ``Outputs(specs)`` makes all the outputs of a call at once, through a C API
  the plans call without Python (small outputs share one allocation). It compiles against torch's C++ headers (15 - 20 s), so a process that finds
  no cached build starts it in a background thread and the plans use new_empty until it is loaded.
  ``ROCJIT_TORCH_ALLOC=0`` turns it off; ``ROCJIT_REQUIRE_NATIVE=1`` makes a failed build an error here too.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

from rocjit import cache

SOURCE = Path(__file__).with_name("launcher.c")
TORCH_ALLOC_SOURCE = Path(__file__).with_name("torch_alloc.cpp")
_status = "not built yet"


class NativeBuildError(RuntimeError):
    pass


def status() -> str:
    return _status


def compiler(cxx: bool = False) -> list[str] | None:
    """The C compiler command: $CC, else the one Python was built with, else cc / gcc / clang; with cxx, the C++
    compiler: $CXX, else Python's, else c++ / g++ / clang++."""
    cands = (("CXX", "c++", "g++", "clang++") if cxx else ("CC", "cc", "gcc", "clang"))
    for cand in (os.environ.get(cands[0]), sysconfig.get_config_var(cands[0]), *cands[1:]):
        if cand:
            argv = shlex.split(cand)
            if argv and shutil.which(argv[0]):
                return argv
    return None


def _key(cc, source: Path = SOURCE, extra=(), prefix: str = "native-") -> str:
    h = hashlib.sha256()
    for part in (source.read_bytes(), sys.version.encode(), (sysconfig.get_config_var("EXT_SUFFIX") or "").encode(),
                 " ".join(cc).encode(), sysconfig.get_paths()["include"].encode(), *(str(e).encode() for e in extra)):
        h.update(part)
        h.update(b"\0")
    return prefix + h.hexdigest()


def _build(cc, source: Path = SOURCE, flags=(), libs=()) -> bytes:
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise NativeBuildError(f"no Python headers (Python.h) in {include}; install the python3-dev package")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "ext.so")
        cmd = [*cc, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", *flags, "-I", include, str(source), "-o", out,
               *libs]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NativeBuildError(f"{cc[0]} failed to run: {e}") from None
        if r.returncode != 0:
            raise NativeBuildError(f"{' '.join(cmd)} failed:\n{(r.stderr or r.stdout).strip()[-2000:]}")
        return Path(out).read_bytes()


def _publish(binary: bytes, digest: str, stem: str = "rocjit_launch") -> Path:
    """The shared object as a file (extensions load from paths) in the cache's private native/ directory, written
    atomically; a file already there is reused only when it is a private regular file with this content."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    path = cache.private_dir("native") / f"{stem}_{digest[:16]}{suffix}"
    try:
        if hashlib.sha256(cache.read_private(path) or b"").hexdigest() == digest:
            return path
    except cache.Damaged:
        cache.remove(path)             # a link or foreign file where ours belongs: replaced, never followed
    cache.write_private(path, binary)
    return path


_LOADED_FDS: list[int] = []


def _load(path: Path, digest: str, name: str = "_rocjit_launch"):
    """Import the extension from a descriptor checked to be a private regular file holding `digest`; dlopen gets
    /proc/self/fd/N, so the file that was checked is the file that is mapped (no window to swap it)."""
    fd = cache.open_private(path)
    if fd is None:
        raise ImportError(f"{path} vanished before it could be loaded")
    try:
        with os.fdopen(os.dup(fd), "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != digest:
                raise ImportError(f"{path} changed on disk before it could be loaded")
        via_fd = f"/proc/self/fd/{fd}"
        where = via_fd if os.path.exists(via_fd) else str(path)
        from importlib.machinery import ExtensionFileLoader
        from importlib.util import module_from_spec, spec_from_file_location
        loader = ExtensionFileLoader(name, where)
        mod = module_from_spec(spec_from_file_location(name, where, loader=loader))
        loader.exec_module(mod)
        if where == via_fd:
            # dlopen knows the library by this path: the descriptor stays open for the life of the process, so no
            # later load (the other extension) can come through the same /proc/self/fd/N and be taken for this one
            _LOADED_FDS.append(fd)
            fd = None
        return mod
    finally:
        if fd is not None:
            os.close(fd)


def _obtain(key: str, build, stem: str, name: str, what: str):
    """(module, path): the cached build of `key` (or build() now) published and loaded. A cached build that
    verifies but does not load (damaged, or from another libc) is built again once."""
    retried = False
    while True:
        meta, binary, hit = cache.get_or_build(key, lambda: ({"kind": what}, build()), count=False)
        digest = hashlib.sha256(binary).hexdigest()
        try:
            path = _publish(binary, digest, stem)
            return _load(path, digest, name), path
        except (ImportError, cache.Damaged) as e:
            if not hit or retried:
                raise ImportError(str(e)) from None
            import warnings
            warnings.warn(f"rocjit: the cached {what} does not load ({e}); rebuilding it", RuntimeWarning,
                          stacklevel=3)
            cache.discard(key)
            retried = True


def _required() -> bool:
    return os.environ.get("ROCJIT_REQUIRE_NATIVE", "") not in ("", "0")


@functools.lru_cache(maxsize=1)
def module():
    """The built extension module, or None (see status())."""
    global _status
    if os.environ.get("ROCJIT_NATIVE_LAUNCH", "") == "0":
        _status = "off (ROCJIT_NATIVE_LAUNCH=0)"
        return None
    try:
        cc = compiler()
        if cc is None:
            raise NativeBuildError("no C compiler found (set CC, or install gcc or clang)")
        mod, path = _obtain(_key(cc), lambda: _build(cc), "rocjit_launch", "_rocjit_launch", "native launcher")
    except (NativeBuildError, OSError, ImportError) as e:
        _status = f"unavailable: {e}"
        if _required():
            raise
        return None
    _status = f"ready ({path})"
    return mod


# ----------------------------------------------------------------------------- the torch allocator
_alloc = {"module": None, "status": "not built yet", "thread": None, "error": None, "callbacks": [], "registered": None}
_alloc_lock = threading.RLock()     # the synchronous build ends inside it
_alloc_ready = threading.Event()


def _torch_build_args():
    """(key extras, compile flags, link arguments) of an extension against the torch that is imported."""
    import torch
    root = Path(torch.__file__).resolve().parent
    lib = root / "lib"
    if not (root / "include" / "ATen").is_dir():
        raise NativeBuildError(f"torch's C++ headers are not installed (no {root / 'include' / 'ATen'})")
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    flags = ["-std=c++20", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-I", str(root / "include"),
             "-I", str(root / "include" / "torch" / "csrc" / "api" / "include")]
    libs = ["-L", str(lib), "-lc10", "-ltorch_cpu", "-ltorch_python", f"-Wl,-rpath,{lib}"]
    extra = (torch.__version__, getattr(torch.version, "git_version", ""), root, *flags, *libs)
    return extra, flags, libs


def _torch_alloc_obtain(cxx, extra, flags, libs, key):
    """Build (or take from the cache) and load the torch allocator. Any thread."""
    try:
        mod, path = _obtain(key, lambda: _build(cxx, TORCH_ALLOC_SOURCE, flags, libs), "rocjit_torch_alloc",
                            "_rocjit_torch_alloc", "torch allocator")
    except Exception as e:          # noqa: BLE001 -- whatever stops the build leaves new_empty in charge
        _alloc_done(f"unavailable: {e}", error=e)
    else:
        _alloc_done(f"ready ({path})", module=mod)


def _alloc_done(status: str, module=None, error=None) -> None:
    """The torch allocator's outcome, final for the process: recorded, then every waiting callback called."""
    with _alloc_lock:
        _alloc.update(status=status, module=module, error=error)
        _alloc_ready.set()
        callbacks, _alloc["callbacks"] = _alloc["callbacks"], []
    for fn in callbacks:
        fn()


def torch_alloc_building() -> bool:
    """Whether the torch allocator is being built in the background now."""
    return _alloc["thread"] is not None and not _alloc_ready.is_set()


def on_torch_alloc(fn) -> None:
    """Call fn() once the background build has ended (at once if it has); each fn is called once."""
    with _alloc_lock:
        if not _alloc_ready.is_set():
            if fn not in _alloc["callbacks"]:
                _alloc["callbacks"].append(fn)
            return
    fn()


def torch_alloc(*, wait: bool = True):
    """The torch allocator extension (its ``Empty`` and ``Outputs`` types), or None (see torch_alloc_status()).

    With ``wait=False`` (the op plans) a process that finds no build in the cache starts one in a background thread
    and gets None until it is loaded; a cached build is loaded at once either way."""
    if _alloc_ready.is_set():
        return _finish_alloc()
    with _alloc_lock:
        if _alloc["thread"] is None and not _alloc_ready.is_set():
            if os.environ.get("ROCJIT_TORCH_ALLOC", "") == "0":
                _alloc_done("off (ROCJIT_TORCH_ALLOC=0)")
                return None
            try:
                cxx = compiler(cxx=True)
                if cxx is None:
                    raise NativeBuildError("no C++ compiler found (set CXX, or install g++ or clang++)")
                extra, flags, libs = _torch_build_args()
            except (NativeBuildError, ImportError, OSError) as e:
                _alloc_done(f"unavailable: {e}", error=e)
                return _finish_alloc()
            key = _key(cxx, TORCH_ALLOC_SOURCE, extra, prefix="torchalloc-")
            if wait or cache.load(key) is not None:
                _torch_alloc_obtain(cxx, extra, flags, libs, key)
            else:
                _alloc["status"] = "building"
                t = threading.Thread(target=_torch_alloc_obtain, args=(cxx, extra, flags, libs, key),
                                     name="rocjit-torch-alloc-build", daemon=True)
                _alloc["thread"] = t
                t.start()
    if wait:
        _alloc_ready.wait()
    return _finish_alloc() if _alloc_ready.is_set() else None


def _finish_alloc():
    if _alloc["error"] is not None and _required():
        raise _alloc["error"]
    return _alloc["module"]


def torch_alloc_status() -> str:
    return _alloc["status"]


def allocator_registered() -> bool:
    """Whether the native launcher's plans take the torch allocator's Outputs (registered once, on first ask)."""
    if _alloc["registered"] is None:
        mod, launch = _alloc["module"], module()
        ok = mod is not None and launch is not None and hasattr(launch, "set_allocator")
        if ok:
            launch.set_allocator(mod._C_API)
        _alloc["registered"] = ok
    return _alloc["registered"]


@functools.lru_cache(maxsize=None)
def torch_dtype_code(dtype) -> int:
    """DLPack dtype of a torch dtype, packed as the launcher compares them (asked of torch itself)."""
    import torch
    return module().dtype_code(torch.Tensor.__dlpack_c_exchange_api__, torch.empty(0, dtype=dtype))
