"""Source -> code object: resolve the source and its includes, build the cache key, compile on a miss.

The key covers the source, the content of every header it can include (looked up beside its includer and in
every search directory, -I options included, recursively; with a macro #include, every file under those
directories), defines, options, name expressions, target, compiler version, rocjit version and the cache schema.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from pathlib import Path

from rocjit import cache, compilers
from rocjit.platform import Compiled

CodeObject = Compiled
_SUFFIXES = (".hip", ".cu", ".cpp", ".cc", ".h", ".hpp", ".cuh")
# every #include / #include_next line, in any #if branch (a superset of what the preprocessor reads)
_INCLUDE = re.compile(rb"^[ \t]*#[ \t]*include(?:_next)?\b[ \t]*([^\r\n]*)", re.M)
# options that add a search directory / name a file the compiler reads before the source
_DIR_OPTIONS = ("-I", "--include-path", "-isystem", "-iquote", "-idirafter")
_FILE_OPTIONS = ("-include", "--pre-include", "-imacros")
# a macro include makes every file under the search directories a possible header: past this many files their
# size and mtime stand in for their content, so a huge directory costs stat calls, not reads
_TREE_CONTENT_LIMIT = 2000
_TREE_WALK_LIMIT = 50_000          # past this (a search directory such as / or ~), the source is not cached at all
_memory: dict[str, Compiled] = {}


@functools.lru_cache(maxsize=1)
def kernels_src_dir() -> Path:
    """The library's HIP sources: inside the installed package, else the source checkout's kernels_src/."""
    here = Path(__file__).resolve().parent
    for cand in (here / "kernels_src", here.parent / "kernels_src"):
        if (cand / "rocjit").is_dir():
            return cand
    raise FileNotFoundError("rocjit's kernels_src directory is missing from this installation")


def read_source(source_or_path) -> tuple[str, str, Path | None]:
    """(text, filename, directory) from inline source, a path, or a name relative to kernels_src/."""
    if isinstance(source_or_path, os.PathLike) or (
            isinstance(source_or_path, str) and "\n" not in source_or_path and source_or_path.endswith(_SUFFIXES)):
        p = Path(source_or_path)
        if not p.is_file() and not p.is_absolute() and (kernels_src_dir() / p).is_file():
            p = kernels_src_dir() / p
        if not p.is_file():
            raise FileNotFoundError(f"kernel source file {str(source_or_path)!r} not found "
                                    f"(looked in the current directory and in {kernels_src_dir()})")
        return p.read_text(), p.name, p.resolve().parent
    if not isinstance(source_or_path, str):
        raise TypeError(f"source must be a string of HIP code or a path, got {type(source_or_path).__name__}")
    return source_or_path, "kernel.hip", None


def include_dirs_for(target: str, user_dirs=(), source_dir: Path | None = None) -> list[str]:
    dirs = [str(d) for d in user_dirs]
    if source_dir is not None:
        dirs.append(str(source_dir))
    dirs.append(str(kernels_src_dir()))
    dirs.extend(compilers.compiler_for(target).shim_dirs())
    return dirs


def _includes(text: bytes):
    """(kind, operand) of each include line: ("quote", name), ("angle", name) or ("macro", the tokens)."""
    for m in _INCLUDE.finditer(text):
        arg = m.group(1).strip()
        if arg[:1] == b'"' and b'"' in arg[1:]:
            yield "quote", arg[1:arg.index(b'"', 1)].decode(errors="replace")
        elif arg[:1] == b"<" and b">" in arg:
            yield "angle", arg[1:arg.index(b">")].decode(errors="replace")
        elif arg and not arg.startswith((b"//", b"/*")):
            yield "macro", arg.decode(errors="replace")


def _option_paths(options) -> tuple[list[str], list[str]]:
    """(directories, files) the compiler options make it search / read: -I dir, -Idir, --include-path=dir, ..."""
    dirs, files = [], []
    opts = [str(o) for o in options]
    i = 0
    while i < len(opts):
        o, value, step = opts[i], None, 1
        for f in _DIR_OPTIONS + _FILE_OPTIONS:
            if o == f and i + 1 < len(opts):
                value, step = opts[i + 1], 2
            elif o.startswith(f + "="):
                value = o[len(f) + 1:]
            elif f == "-I" and o.startswith("-I") and len(o) > 2:
                value = o[2:]
            if value is not None:
                (dirs if f in _DIR_OPTIONS else files).append(value)
                break
        i += step
    return dirs, files


def _file_digest(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        return f"unreadable: {e.strerror}"


def _header_digest(text: bytes, dirs: list[str], seen: dict[str, tuple[str, str]], here: str | None,
                   state: dict) -> None:
    """Record (name as written, content digest) of every file an #include of `text` can reach, recursively.

    Each include is looked up in the includer's own directory (quoted form) and in *every* search directory,
    not only the first hit, so the key does not depend on modelling each compiler's search order exactly: an
    edit to any candidate changes it. A macro include (#include HDR) cannot be resolved without preprocessing,
    so it marks every search directory to be digested whole (see _tree_digest)."""
    if here is not None:
        state["dirs"].setdefault(here, None)
    for kind, name in _includes(text):
        if kind == "macro":
            state["macro"] = True
            continue
        for d in ([here] if kind == "quote" and here is not None else []) + dirs:
            p = os.path.normpath(os.path.join(d, name))
            if not os.path.isfile(p):
                continue
            real = os.path.realpath(p)
            if real in seen:
                continue
            try:
                data = Path(p).read_bytes()
            except OSError as e:
                seen[real] = (name, f"unreadable: {e.strerror}")
                continue
            seen[real] = (name, hashlib.sha256(data).hexdigest())
            _header_digest(data, dirs, seen, os.path.dirname(p), state)


def included_files(path: Path, dirs) -> list[Path]:
    """Every file an #include of the file at `path` can reach, recursively, looked up as the cache key looks them up
    (beside their includer, then in each of `dirs`), each once, in the order first reached."""
    seen: dict[str, tuple[str, str]] = {}
    _header_digest(Path(path).read_bytes(), [str(d) for d in dirs], seen, str(Path(path).parent),
                   {"macro": False, "dirs": {}})
    return [Path(p) for p in seen]


def _tree_digest(dirs) -> list:
    """(directory index, relative path, digest) of every file under each directory: the fallback for macro
    includes. Hidden directories and __pycache__ are skipped (no compiler search reaches into them by name)."""
    import warnings
    out, n = [], 0
    for i, top in enumerate(dict.fromkeys(dirs)):
        for root, subdirs, files in os.walk(top):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and d != "__pycache__")
            for f in sorted(files):
                p = os.path.join(root, f)
                if not os.path.isfile(p):
                    continue
                n += 1
                if n > _TREE_WALK_LIMIT:
                    warnings.warn(f"rocjit: the source has a macro #include and its include directories hold more "
                                  f"than {_TREE_WALK_LIMIT} files, so it is compiled without the on-disk cache; "
                                  f"give its headers a directory of their own", RuntimeWarning, stacklevel=4)
                    return [("uncached", os.urandom(16).hex())]       # a key no later call can match
                if n <= _TREE_CONTENT_LIMIT:
                    sig = _file_digest(p)
                else:
                    st = os.stat(p)
                    sig = f"{st.st_size}:{st.st_mtime_ns}"
                out.append((i, os.path.relpath(p, top), sig))
    if n > _TREE_CONTENT_LIMIT:
        warnings.warn(f"rocjit: the source has a macro #include, so every file under its include directories "
                      f"({n} files) is part of the cache key; give its headers a directory of their own to make "
                      f"this cheaper", RuntimeWarning, stacklevel=4)
    return out


def define_options(defines) -> list[str]:
    if not defines:
        return []
    out = []
    for k, v in sorted(dict(defines).items()):
        if not re.fullmatch(r"[A-Za-z_]\w*", str(k)):
            raise ValueError(f"defines: {k!r} is not a valid macro name")
        out.append(f"-D{k}" if v is None or v is True else f"-D{k}={int(v) if isinstance(v, bool) else v}")
    return out


@functools.lru_cache(maxsize=None)
def compiler_version(target: str) -> str:
    return compilers.compiler_for(target).version()


def _version() -> str:
    from rocjit import __version__
    return __version__


def cache_key(source: str, target: str, options, dirs, name_expressions, filename: str) -> str:
    opt_dirs, opt_files = _option_paths(options)
    search = [*opt_dirs, *dirs]
    headers: dict[str, tuple[str, str]] = {}
    state = {"macro": False, "dirs": {}}
    # quoted includes of the main source: NVRTC looks in the working directory for an in-memory source
    _header_digest(source.encode(), search, headers, os.curdir, state)
    for name in opt_files:                   # -include / --pre-include: read before the source
        _header_digest(f'#include "{name}"\n'.encode(), search, headers, os.curdir, state)
    blob = {
        "schema": cache.SCHEMA, "rocjit": _version(), "compiler": compiler_version(target), "target": target,
        "source": source, "filename": filename, "options": list(options), "names": list(name_expressions),
        # headers by name as written and content, not by where they live, so one cache serves any install location
        "headers": sorted(headers.values()),
        "tree": _tree_digest([*search, *state["dirs"]]) if state["macro"] else None,
        "env": os.environ.get("ROCJIT_AMD_COMPILER", ""),
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def compile(source_or_path, target: str, *, defines=None, options=None, name_expressions=(),
            include_dirs=()) -> Compiled:
    """Compile for a named target (sm_90a, gfx90a, gfx942, gfx950, ...) — no GPU needed; cached on disk."""
    source, filename, src_dir = read_source(source_or_path)
    return compile_text(source, target, filename=filename, source_dir=src_dir, defines=defines, options=options,
                        name_expressions=name_expressions, include_dirs=include_dirs)


def compile_text(source: str, target: str, *, filename="kernel.hip", source_dir=None, defines=None, options=None,
                 name_expressions=(), include_dirs=()) -> Compiled:
    compiler = compilers.compiler_for(target)     # checks the target before anything else sees it
    opts = define_options(defines) + list(options or ())
    names = tuple(dict.fromkeys(name_expressions))
    dirs = include_dirs_for(target, include_dirs, source_dir)
    key = cache_key(source, target, opts, dirs, names, filename)
    hit = _memory.get(key)
    if hit is not None:
        return hit

    def build():
        c = compiler.compile(source, target=target, options=opts, include_dirs=dirs, name_expressions=names,
                             filename=filename)
        return {"format": c.format, "target": c.target, "lowered": c.lowered, "log": c.log}, c.binary

    meta, binary, _ = cache.get_or_build(key, build)
    co = Compiled(binary, meta["format"], meta["target"], dict(meta["lowered"]), meta.get("log", ""), key)
    _memory[key] = co
    return co
