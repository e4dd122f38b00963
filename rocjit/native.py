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
    """The shared object as a file (extensions load from paths), written atomically and checked by content."""
    d = cache.cache_dir() / "native"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"rocjit_launch_{digest[:16]}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    try:
        if hashlib.sha256(path.read_bytes()).hexdigest() == digest:
            return path
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(binary)
    os.replace(tmp, path)
    return path


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
        meta, binary, _ = cache.get_or_build(_key(cc), lambda: ({"kind": "native launcher"}, _build(cc)),
                                                count=False)
        path = _publish(binary, hashlib.sha256(binary).hexdigest())
        from importlib.machinery import ExtensionFileLoader
        from importlib.util import module_from_spec, spec_from_file_location
        loader = ExtensionFileLoader("_rocjit_launch", str(path))
        mod = module_from_spec(spec_from_file_location("_rocjit_launch", str(path), loader=loader))
        loader.exec_module(mod)
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
