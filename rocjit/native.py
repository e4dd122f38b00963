"""The native launcher: ``launcher.c``, a small C extension built with the machine's C compiler the first time a
kernel gets a fast path, and kept in the rocjit cache like a code object (one build per Python and source).

It makes the common launch (framework tensors, Python scalars, the current stream) one C call; every other case
goes to the Python launcher it wraps, so results and errors are the same with or without it. Where it cannot be
built (no C compiler, no Python headers) launches use the Python launcher alone; ``python -m rocjit`` says which.
``ROCJIT_NATIVE_LAUNCH=0`` turns it off; ``ROCJIT_REQUIRE_NATIVE=1`` makes a failed build an error (CI).
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
from pathlib import Path

from rocjit import cache

SOURCE = Path(__file__).with_name("launcher.c")
_status = "not built yet"


class NativeBuildError(RuntimeError):
    pass


def status() -> str:
    return _status


def compiler() -> list[str] | None:
    """The C compiler command: $CC, else the one Python was built with, else cc / gcc / clang."""
    for cand in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"):
        if cand:
            argv = shlex.split(cand)
            if argv and shutil.which(argv[0]):
                return argv
    return None


def _key(cc) -> str:
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), sys.version.encode(), (sysconfig.get_config_var("EXT_SUFFIX") or "").encode(),
                 " ".join(cc).encode(), sysconfig.get_paths()["include"].encode()):
        h.update(part)
        h.update(b"\0")
    return "native-" + h.hexdigest()


def _build(cc) -> bytes:
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise NativeBuildError(f"no Python headers (Python.h) in {include}; install the python3-dev package")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "launch.so")
        cmd = [*cc, "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-I", include, str(SOURCE), "-o", out]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NativeBuildError(f"{cc[0]} failed to run: {e}") from None
        if r.returncode != 0:
            raise NativeBuildError(f"{' '.join(cmd)} failed:\n{(r.stderr or r.stdout).strip()[-2000:]}")
        return Path(out).read_bytes()


def _publish(binary: bytes, digest: str) -> Path:
    """The shared object as a file (extensions load from paths) in the cache's private native/ directory, written
    atomically; a file already there is reused only when it is a private regular file with this content."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    path = cache.private_dir("native") / f"rocjit_launch_{digest[:16]}{suffix}"
    try:
        if hashlib.sha256(cache.read_private(path) or b"").hexdigest() == digest:
            return path
    except cache.Damaged:
        cache.remove(path)             # a link or foreign file where ours belongs: replaced, never followed
    cache.write_private(path, binary)
    return path


def _load(path: Path, digest: str):
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
        loader = ExtensionFileLoader("_rocjit_launch", where)
        mod = module_from_spec(spec_from_file_location("_rocjit_launch", where, loader=loader))
        loader.exec_module(mod)
        return mod
    finally:
        os.close(fd)


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
        key, retried = _key(cc), False
        while True:
            meta, binary, hit = cache.get_or_build(key, lambda: ({"kind": "native launcher"}, _build(cc)),
                                                      count=False)
            digest = hashlib.sha256(binary).hexdigest()
            try:
                path = _publish(binary, digest)
                mod = _load(path, digest)
                break
            except (ImportError, cache.Damaged) as e:
                if not hit or retried:
                    raise ImportError(str(e)) from None
                # a cached build that verifies but does not load (damaged, or from another libc): build it again
                import warnings
                warnings.warn(f"rocjit: the cached native launcher does not load ({e}); rebuilding it",
                              RuntimeWarning, stacklevel=2)
                cache.discard(key)
                retried = True
    except (NativeBuildError, OSError, ImportError) as e:
        _status = f"unavailable: {e}"
        if os.environ.get("ROCJIT_REQUIRE_NATIVE", "") not in ("", "0"):
            raise
        return None
    _status = f"ready ({path})"
    return mod


@functools.lru_cache(maxsize=None)
def torch_dtype_code(dtype) -> int:
    """DLPack dtype of a torch dtype, packed as the launcher compares them (asked of torch itself)."""
    import torch
    return module().dtype_code(torch.Tensor.__dlpack_c_exchange_api__, torch.empty(0, dtype=dtype))
