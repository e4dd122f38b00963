"""The on-disk code-object cache: private to its user, atomic publish, content-verified reads, per-key locks.

Layout: <dir>/v<SCHEMA>/<key[:2]>/<key>.co ; each entry is a magic line, a JSON header line, then the binary.
The header's digest covers the key, the rest of the header and the binary, so a truncated, corrupt, edited or
misplaced entry is detected, dropped with a warning and rebuilt.

The digest only detects accidents. What keeps other local users out is the directory itself: it must be owned by
the user, not writable by group or others, and reached through parents that only the user or root can change
(as OpenSSH asks of ~/.ssh); otherwise it is refused and a private temporary cache is used, with a warning.
Inside it, every file is opened without following symlinks and checked on the open descriptor (regular, owned by
the user, not writable by others), and every directory rocjit creates is checked the same way.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import warnings
from pathlib import Path

SCHEMA = 2                         # 2: the digest covers key + header + binary (1 covered the binary only)
_MAGIC = b"ROCJIT-CO\n"
# no symlink at the last component; no blocking on a FIFO planted where a file should be
_SAFE_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_warned: set = set()
_fallback: Path | None = None


class CacheUnavailable(OSError):
    """No trustworthy, writable cache directory could be had (the caller works without one)."""


class Damaged(Exception):
    """A cache path holds something rocjit did not write or cannot trust; the message says what."""


def _warn(message: str, once=None) -> None:
    if once is not None:
        if once in _warned:
            return
        _warned.add(once)
    warnings.warn(f"rocjit: {message}", RuntimeWarning, stacklevel=3)


# ----------------------------------------------------------------------------- the directory and its trust
def configured_dir() -> str:
    """ROCJIT_CACHE_DIR, else $XDG_CACHE_HOME/rocjit, else ~/.cache/rocjit (as configured, before any checks)."""
    return os.environ.get("ROCJIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "rocjit")


def _dir_problem(st: os.stat_result, what: str) -> str | None:
    if not stat.S_ISDIR(st.st_mode):
        return f"{what} is not a directory"
    if st.st_uid != os.geteuid():
        return f"{what} is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _parents_problem(real: str) -> str | None:
    """Whoever can write a parent can swap the directory itself, so parents must be the user's or root's and not
    writable by others, unless sticky (as /tmp is: there only an entry's owner may rename it)."""
    parent = os.path.dirname(real)
    while True:
        st = os.stat(parent)
        if st.st_uid not in (os.geteuid(), 0):
            return f"its parent {parent} is owned by uid {st.st_uid}"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"its parent {parent} is writable by group or others"
        if os.path.dirname(parent) == parent:
            return None
        parent = os.path.dirname(parent)


def _makedirs_private(path: str) -> None:
    """mkdir -p where every component created is 0700 (os.makedirs would give the parents the umask's mode)."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            pass


def trusted_dir(root: str) -> Path:
    """The real path of `root`, created (0700) if missing, or ValueError saying why it cannot be trusted to hold
    code this process will run: not the user's own, writable by group or others, or under a parent that is."""
    try:
        _makedirs_private(root)
        real = os.path.realpath(root)      # from here on the resolved path: a symlink could be re-pointed later
        problem = _parents_problem(real)
        if problem:
            raise ValueError(problem)
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            problem = _dir_problem(os.fstat(fd), "it")
        finally:
            os.close(fd)
    except OSError as e:
        raise ValueError(f"it cannot be used ({e.strerror or e})") from None
    if problem:
        raise ValueError(problem)
    if not os.access(real, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        raise ValueError("it is not writable")
    return Path(real)


def _private_fallback() -> Path:
    """One fresh 0700 directory per process (mkdtemp), removed at exit: safe, but not shared between processes."""
    global _fallback
    if _fallback is None or not os.path.isdir(_fallback):
        try:
            d = tempfile.mkdtemp(prefix=f"rocjit-cache-{os.geteuid()}-")
        except OSError as e:
            raise CacheUnavailable(f"no private temporary directory could be made ({e})") from None
        atexit.register(shutil.rmtree, d, True)
        try:
            _fallback = trusted_dir(d)
        except ValueError as e:
            raise CacheUnavailable(f"the temporary directory {d} cannot be trusted either: {e}") from None
    return _fallback


def cache_dir() -> Path:
    """The verified cache directory: the configured one when it is the user's own and private, else (with a
    warning saying why) a private temporary one for this process. CacheUnavailable when neither can be had."""
    root = configured_dir()
    try:
        return trusted_dir(root)
    except ValueError as e:
        fallback = _private_fallback()
        _warn(f"not using the cache directory {root}: {e}. Using the private temporary cache {fallback} for this "
              f"process instead (fix: make the directory yours and private, e.g. chmod 700, or set ROCJIT_CACHE_DIR)",
              once=(root, str(e)))
        return fallback


def private_dir(*parts: str, root: Path | None = None) -> Path:
    """<cache>/<parts...>, each component created 0700 or checked to be a real directory the user owns privately."""
    d = root if root is not None else cache_dir()
    for part in parts:
        d = d / part
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, 0o700)
            st = os.lstat(d)               # lstat: a symlink planted here is refused, not followed
        except OSError as e:
            raise CacheUnavailable(f"cannot create {d}: {e.strerror or e}") from None
        problem = _dir_problem(st, str(d))
        if problem:
            raise CacheUnavailable(problem)
    return d


# ----------------------------------------------------------------------------- files inside it
def _check_file(fd: int) -> None:
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise Damaged("it is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise Damaged("it is not a regular file")
    if st.st_uid != os.geteuid():
        raise Damaged(f"it is owned by uid {st.st_uid}, not by you")
    if st.st_mode & 0o022:
        raise Damaged("it is writable by group or others")


def open_private(path, flags: int = os.O_RDONLY, mode: int = 0o600) -> int | None:
    """A descriptor for a regular file the user owns (not a symlink, FIFO, directory...), or None if absent;
    Damaged saying what is there otherwise. The checks are made on the descriptor, so nothing can be swapped
    in between."""
    try:
        fd = os.open(path, flags | _SAFE_OPEN, mode)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Damaged("it is a symbolic link") from None
        if e.errno == errno.EISDIR:
            raise Damaged("it is a directory") from None
        raise Damaged(e.strerror or str(e)) from None
    try:
        _check_file(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_private(path) -> bytes | None:
    """The bytes of a regular file the user owns, None if absent, Damaged otherwise."""
    fd = open_private(path)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def write_private(path, data: bytes) -> None:
    """Publish atomically: a 0600 temp file beside `path` (mkstemp: O_EXCL, never a symlink), fsync'd, then
    renamed over it (a rename replaces a planted symlink rather than writing through it)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:16]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove(path) -> None:
    """Remove whatever is at a cache path (a symlink itself, never its target; a directory with its contents)."""
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)


@contextlib.contextmanager
def lock(path):
    """An exclusive lock held while the block runs (flock on a private lock file; released if the process dies).
    Where the lock file cannot be had, the block runs unlocked with a warning: work may be repeated, not lost."""
    try:
        fd = open_private(path, os.O_RDWR | os.O_CREAT)
    except Damaged as e:
        _warn(f"cannot lock {path} ({e}); continuing without the lock", once=("lock", str(path)))
        fd = None
    if fd is None:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- entries
def _entries_dir(root: Path | None = None) -> Path:
    return (root if root is not None else cache_dir()) / f"v{SCHEMA}"


def _path(key: str, root: Path | None = None) -> Path:
    return _entries_dir(root) / key[:2] / f"{key}.co"


def _digest(key: str, meta: dict, binary: bytes) -> str:
    h = hashlib.sha256(key.encode() + b"\0")
    h.update(json.dumps({k: v for k, v in meta.items() if k != "sha256"}, sort_keys=True).encode() + b"\0")
    h.update(binary)
    return h.hexdigest()


def _decode(key: str, data: bytes):
    if not data.startswith(_MAGIC):
        raise ValueError("bad magic")
    nl = data.index(b"\n", len(_MAGIC))
    meta = json.loads(data[len(_MAGIC):nl])
    binary = data[nl + 1:]
    if not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str) or not isinstance(meta.get("size"), int):
        raise ValueError("malformed header")
    if len(binary) != meta["size"] or _digest(key, meta, binary) != meta["sha256"]:
        raise ValueError("content hash mismatch")
    return meta, binary


def _load(root: Path, key: str):
    p = _path(key, root)
    try:
        data = read_private(p)
        if data is None:
            return None
        return _decode(key, data)
    except (Damaged, ValueError, UnicodeDecodeError) as e:      # JSONDecodeError is a ValueError
        _warn(f"discarding corrupt cache entry {p} ({e}); it will be rebuilt")
        remove(p)
        return None


def load(key: str):
    """(meta, binary) of a verified entry, or None. A damaged entry is removed with a warning."""
    try:
        return _load(cache_dir(), key)
    except CacheUnavailable:
        return None


def _store(root: Path, key: str, meta: dict, binary: bytes) -> None:
    p = _path(key, root)
    meta = dict(meta, size=len(binary))
    meta["sha256"] = _digest(key, meta, binary)
    private_dir(f"v{SCHEMA}", key[:2], root=root)
    if os.path.lexists(p) and stat.S_ISDIR(os.lstat(p).st_mode):
        _warn(f"removing the directory found where the cache entry {p} belongs")
        remove(p)
    write_private(p, _MAGIC + json.dumps(meta, sort_keys=True).encode() + b"\n" + binary)


def store(key: str, meta: dict, binary: bytes) -> None:
    """Publish an entry atomically (OSError / CacheUnavailable when the cache cannot be written)."""
    _store(cache_dir(), key, meta, binary)


def discard(key: str) -> None:
    """Drop an entry (one that verified but turned out unusable, e.g. a shared object that does not load)."""
    with contextlib.suppress(CacheUnavailable):
        remove(_path(key, cache_dir()))


def get_or_build(key: str, build, *, count: bool = True):
    """(meta, binary, hit): cached entry, or build() -> (meta, binary) under the key's lock, built once
    even when many processes ask at the same time. `count`: record the hit or miss in the kernel statistics.
    A cache that cannot be used or written costs a warning and a rebuild, never the result."""
    try:
        root = cache_dir()
    except CacheUnavailable as e:
        _warn(f"working without an on-disk cache: {e}", once=("unavailable", str(e)))
        return (*build(), False)
    found = _load(root, key)
    if found is None:
        try:
            guard = lock(private_dir(f"v{SCHEMA}", key[:2], root=root) / f"{key}.lock")
        except CacheUnavailable as e:
            _warn(f"cannot lock the cache entry {key[:16]}… ({e}); building without the lock")
            guard = contextlib.nullcontext()
        with guard:
            found = _load(root, key)          # another process may have built it while we waited
            if found is None:
                meta, binary = build()
                try:
                    _store(root, key, meta, binary)
                except OSError as e:          # CacheUnavailable included
                    _warn(f"could not save to the cache in {root} ({e}); the result is used but not kept")
                if count:
                    _count(root, "misses")
                return meta, binary, False
    if count:
        _count(root, "hits")
    return (*found, True)


# ----------------------------------------------------------------------------- statistics & maintenance
def _stats_path(root: Path | None = None) -> Path:
    return (root if root is not None else cache_dir()) / "stats.log"


def _count(root: Path, field: str) -> None:
    """One byte per event, appended with O_APPEND: atomic across processes without a lock."""
    try:
        fd = open_private(_stats_path(root), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except (Damaged, OSError):
        return              # statistics are best effort; never fail a compile (or follow a planted link) for them
    try:
        os.write(fd, b"h" if field == "hits" else b"m")
    except OSError:
        pass
    finally:
        os.close(fd)


def _entry_files(root: Path) -> list[os.stat_result]:
    d = _entries_dir(root)
    out = []
    for f in (d.glob("*/*.co") if d.is_dir() else ()):
        with contextlib.suppress(OSError):
            st = os.lstat(f)
            if stat.S_ISREG(st.st_mode):
                out.append(st)
    return out


def info() -> dict:
    root = cache_dir()
    files = _entry_files(root)
    try:
        log = read_private(_stats_path(root)) or b""
    except Damaged:
        log = b""
    return {"dir": str(root), "schema": SCHEMA, "entries": len(files),
            "bytes": sum(st.st_size for st in files), "hits": log.count(b"h"), "misses": log.count(b"m")}


def clear() -> int:
    """Remove every entry (and the statistics); returns how many entries were removed."""
    root = cache_dir()
    n = len(_entry_files(root))
    for child in root.iterdir():
        if (child.name.startswith("v") or child.name == "native") and stat.S_ISDIR(os.lstat(child).st_mode):
            shutil.rmtree(child, ignore_errors=True)
    remove(_stats_path(root))
    return n
