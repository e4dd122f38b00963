"""Source -> code object: resolve the source and its includes, build the cache key, compile on a miss.

The key covers the source, the content of every header it includes (found on the include path, recursively),
defines, options, name expressions, target, compiler version, rocjit version and the cache schema.
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
_INCLUDE = re.compile(rb'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
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


def _header_digest(text: bytes, dirs: list[str], seen: dict[str, str]) -> None:
    """Hash every header reachable through the include path (a superset of what the preprocessor reads)."""
    for name in _INCLUDE.findall(text):
        name = name.decode(errors="replace")
        for d in dirs:
            p = os.path.join(d, name)
            if p not in seen and os.path.isfile(p):
                data = Path(p).read_bytes()
                seen[p] = hashlib.sha256(data).hexdigest()
                _header_digest(data, dirs, seen)
                break


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
    headers: dict[str, str] = {}
    _header_digest(source.encode(), dirs, headers)
    blob = {
        "schema": cache.SCHEMA, "rocjit": _version(), "compiler": compiler_version(target), "target": target,
        "source": source, "filename": filename, "options": list(options), "names": list(name_expressions),
        # headers by content, not by where they live, so one cache serves any install location
        "headers": sorted(headers.values()),
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
