"""The on-disk code-object cache: key coverage, atomic publish, corruption recovery, an 8-process race."""
import json
import multiprocessing as mp
import os
import stat
import subprocess
import sys
import warnings

import pytest

import rocjit
from rocjit import cache, compiler

SRC = r"""
#include <hip/hip_runtime.h>
#include "my_helpers.h"
__global__ void k(float* y) { y[threadIdx.x] = HELPER_VALUE; }
"""


@pytest.fixture
def src_dir(tmp_path):
    d = tmp_path / "src"
    d.mkdir()
    (d / "my_helpers.h").write_text('#include "nested.h"\n#define HELPER_VALUE NESTED\n')
    (d / "nested.h").write_text("#define NESTED 1.0f\n")
    return d


def _key(src_dir, **kw):
    args = dict(target="sm_90a", options=[], names=("k",))
    args.update(kw)
    dirs = compiler.include_dirs_for(args["target"], [str(src_dir)])
    return compiler.cache_key(SRC, args["target"], args["options"], dirs, args["names"], "kernel.hip")


def test_key_covers_headers_defines_options_target(src_dir):
    base = _key(src_dir)
    assert _key(src_dir) == base
    assert _key(src_dir, options=["-DX=1"]) != base
    assert _key(src_dir, names=("k", "j")) != base
    (src_dir / "nested.h").write_text("#define NESTED 2.0f\n")      # a header two levels down changed
    assert _key(src_dir) != base


def test_compile_uses_cache_and_header_edits_rebuild(fresh_cache, src_dir):
    co1 = rocjit.compile(SRC, "sm_90a", include_dirs=[src_dir], name_expressions=["k"])
    assert co1.format == "cubin" and co1.binary[:4] == b"\x7fELF"
    assert cache.info()["misses"] == 1
    compiler._memory.clear()
    co2 = rocjit.compile(SRC, "sm_90a", include_dirs=[src_dir], name_expressions=["k"])
    assert co2.binary == co1.binary and cache.info()["hits"] == 1
    (src_dir / "nested.h").write_text("#define NESTED 3.0f\n")
    co3 = rocjit.compile(SRC, "sm_90a", include_dirs=[src_dir], name_expressions=["k"])
    assert co3.key != co1.key and cache.info()["misses"] == 2


def test_defines_reach_the_compiler(fresh_cache):
    src = "#include <hip/hip_runtime.h>\n#if VEC != 8\n#error VEC must be 8\n#endif\n__global__ void k(){}\n"
    rocjit.compile(src, "sm_90a", defines={"VEC": 8})
    with pytest.raises(rocjit.CompileError, match="VEC must be 8"):
        rocjit.compile(src, "sm_90a", defines={"VEC": 4})
    with pytest.raises(ValueError, match="not a valid macro name"):
        rocjit.compile(src, "sm_90a", defines={"1X": 1})


def test_cache_dir_is_private(fresh_cache):
    d = cache.cache_dir()
    assert d == fresh_cache and stat.S_IMODE(os.stat(d).st_mode) == 0o700


def test_atomic_publish_leaves_no_temp_files(fresh_cache):
    cache.store("ab" + "0" * 62, {"format": "cubin"}, b"payload")
    files = os.listdir(cache.cache_dir() / f"v{cache.SCHEMA}" / "ab")
    assert files == ["ab" + "0" * 62 + ".co"]
    assert cache.load("ab" + "0" * 62)[1] == b"payload"


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_corrupt_entry_is_discarded_and_rebuilt(fresh_cache, damage):
    key = "cd" + "1" * 62
    cache.store(key, {"format": "cubin"}, b"x" * 100)
    p = cache._path(key)
    data = bytearray(p.read_bytes())
    if damage == "truncate":
        data = data[:-10]
    elif damage == "flip":
        data[-1] ^= 0xFF
    else:
        data = b"not a cache entry"
    p.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match="discarding corrupt cache entry"):
        assert cache.load(key) is None
    assert not p.exists()
    builds = []
    meta, binary, hit = cache.get_or_build(key, lambda: (builds.append(1), ({"format": "cubin"}, b"y" * 7))[1])
    assert (binary, hit, builds) == (b"y" * 7, False, [1])


def test_compile_recovers_from_corrupt_entry(fresh_cache):
    src = "#include <hip/hip_runtime.h>\n__global__ void k(int* p){ p[0] = 42; }\n"
    co = rocjit.compile(src, "sm_90a")
    p = cache._path(co.key)
    p.write_bytes(p.read_bytes()[:50])
    compiler._memory.clear()
    with pytest.warns(RuntimeWarning, match="corrupt"):
        co2 = rocjit.compile(src, "sm_90a")
    assert co2.binary == co.binary and cache.load(co.key) is not None


_RACE_SRC = "#include <hip/hip_runtime.h>\n__global__ void race_kernel(float* p){ p[threadIdx.x] *= 2.0f; }\n"


def _race_worker(cache_dir, q):
    os.environ["ROCJIT_CACHE_DIR"] = cache_dir
    try:
        co = rocjit.compile(_RACE_SRC, "sm_90a")
        q.put(("ok", co.key, len(co.binary)))
    except Exception as e:  # pragma: no cover - reported to the parent
        q.put(("error", repr(e), 0))


def test_eight_processes_compile_once(fresh_cache):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_race_worker, args=(str(fresh_cache), q)) for _ in range(8)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(r[0] == "ok" for r in results), results
    assert len({r[1] for r in results}) == 1
    info = cache.info()
    assert (info["misses"], info["hits"], info["entries"]) == (1, 7, 1), info


def test_cli_cache_show_and_clear(fresh_cache):
    rocjit.compile("#include <hip/hip_runtime.h>\n__global__ void k(){}\n", "sm_90a")
    env = dict(os.environ, ROCJIT_CACHE_DIR=str(fresh_cache))
    out = subprocess.run([sys.executable, "-m", "rocjit", "cache", "--json"], env=env, capture_output=True,
                         text=True, check=True).stdout
    info = json.loads(out)
    assert info["entries"] == 1 and info["dir"] == str(fresh_cache) and info["misses"] == 1
    out = subprocess.run([sys.executable, "-m", "rocjit", "cache", "--clear"], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert "removed 1 entries" in out and cache.info()["entries"] == 0


def test_corrupt_warning_is_not_silenced_by_default(fresh_cache):
    key = "ef" + "2" * 62
    cache.store(key, {}, b"z")
    cache._path(key).write_bytes(b"junk")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cache.load(key)
    assert any("corrupt" in str(x.message) for x in w)
