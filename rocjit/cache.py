"""The on-disk code-object cache: atomic publish, content-verified reads, per-key locks.

Layout: <dir>/v<SCHEMA>/<key[:2]>/<key>.co ; each entry is a JSON header line followed by the binary.
The header carries the binary's SHA-256, so a truncated or corrupt entry is detected, dropped and rebuilt.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

SCHEMA = 1
_MAGIC = b"ROCJIT-CO\n"


def cache_dir() -> Path:
    """ROCJIT_CACHE_DIR, else $XDG_CACHE_HOME/rocjit, else ~/.cache/rocjit; created private (0700)."""
    root = os.environ.get("ROCJIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "rocjit")
    p = Path(root)
    if not p.is_dir():
        p.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(p, 0o700)
    return p


def _entries_dir() -> Path:
    return cache_dir() / f"v{SCHEMA}"


def _path(key: str) -> Path:
    return _entries_dir() / key[:2] / f"{key}.co"


def _lock(key: str):
    from filelock import FileLock
    d = _entries_dir() / key[:2]
    d.mkdir(parents=True, exist_ok=True)
    return FileLock(str(d / f"{key}.lock"))


def load(key: str):
    """(meta, binary) of a verified entry, or None. A damaged entry is removed with a warning."""
    p = _path(key)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return None
    try:
        if not data.startswith(_MAGIC):
            raise ValueError("bad magic")
        nl = data.index(b"\n", len(_MAGIC))
        meta = json.loads(data[len(_MAGIC):nl])
        binary = data[nl + 1:]
        if len(binary) != meta["size"] or hashlib.sha256(binary).hexdigest() != meta["sha256"]:
            raise ValueError("content hash mismatch")
        return meta, binary
    except (ValueError, KeyError, json.JSONDecodeError) as e:
        warnings.warn(f"rocjit: discarding corrupt cache entry {p} ({e}); it will be rebuilt", RuntimeWarning, stacklevel=3)
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        return None


def store(key: str, meta: dict, binary: bytes) -> None:
    """Publish atomically: write a temp file beside the entry, then os.replace it into place."""
    p = _path(key)
    p.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(meta, size=len(binary), sha256=hashlib.sha256(binary).hexdigest())
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{key[:16]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + json.dumps(meta, sort_keys=True).encode() + b"\n" + binary)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def get_or_build(key: str, build, *, count: bool = True):
    """(meta, binary, hit): cached entry, or build() -> (meta, binary) under the key's lock, built once
    even when many processes ask at the same time. `count`: record the hit or miss in the kernel statistics."""
    found = load(key)
    if found is None:
        with _lock(key):
            found = load(key)          # another process may have built it while we waited
            if found is None:
                meta, binary = build()
                store(key, meta, binary)
                if count:
                    _count("misses")
                return meta, binary, False
    if count:
        _count("hits")
    return (*found, True)


# ----------------------------------------------------------------------------- statistics & maintenance
def _stats_path() -> Path:
    return cache_dir() / "stats.log"


def _count(field: str) -> None:
    """One byte per event, appended with O_APPEND: atomic across processes without a lock."""
    try:
        fd = os.open(_stats_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, b"h" if field == "hits" else b"m")
        finally:
            os.close(fd)
    except OSError:
        pass  # statistics are best effort; never fail a compile for them


def info() -> dict:
    d = _entries_dir()
    files = list(d.glob("*/*.co")) if d.exists() else []
    try:
        log = _stats_path().read_bytes()
    except FileNotFoundError:
        log = b""
    return {"dir": str(cache_dir()), "schema": SCHEMA, "entries": len(files),
            "bytes": sum(f.stat().st_size for f in files), "hits": log.count(b"h"), "misses": log.count(b"m")}


def clear() -> int:
    """Remove every entry (and the statistics); returns how many entries were removed."""
    import shutil
    n = info()["entries"]
    root = cache_dir()
    for child in root.iterdir():
        if (child.name.startswith("v") or child.name == "native") and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
    for f in ("stats.log",):
        try:
            (root / f).unlink()
        except FileNotFoundError:
            pass
    return n
