"""The cache key sees every header the compiler can read: found beside its includer (nested, relative), through
-I options, through a macro #include, through -include; an edit to any of them must never serve the old binary."""
import shutil

import pytest

import rocjit
from rocjit import cache, compiler

TARGETS = ["sm_90a", "gfx942"]


@pytest.fixture(autouse=True)
def _offline_versions(monkeypatch):
    # the key of an AMD target needs only a version string, not an installed toolchain
    real = compiler.compiler_version
    monkeypatch.setattr(compiler, "compiler_version", lambda t: real(t) if t.startswith("sm_") else "test-clang")


def _key(target, source, *, options=(), include_dirs=(), source_dir=None):
    dirs = compiler.include_dirs_for(target, include_dirs, source_dir)
    return compiler.cache_key(source, target, list(options), dirs, (), "kernel.hip")


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """proj/main.hip -> "inc/a.h" -> "b.h" (beside a.h) -> "../common/c.h"; proj/extra/x.h for -I; cwd elsewhere."""
    proj = tmp_path / "proj"
    (proj / "inc").mkdir(parents=True)
    (proj / "common").mkdir()
    (proj / "extra" / "sub").mkdir(parents=True)
    (proj / "inc" / "a.h").write_text('#include "b.h"\n#define A_VAL B_VAL\n')
    (proj / "inc" / "b.h").write_text('#include "../common/c.h"\n#define B_VAL C_VAL\n')
    (proj / "common" / "c.h").write_text("#define C_VAL 1\n")
    (proj / "extra" / "x.h").write_text("#define X_VAL 1\n")
    (proj / "extra" / "sub" / "y.h").write_text("#define Y_VAL 1\n")
    (proj / "main.hip").write_text('#include "inc/a.h"\n__global__ void k(int* p){ p[0] = A_VAL; }\n')
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return proj


@pytest.mark.parametrize("target", TARGETS)
def test_nested_relative_includes(tree, target):
    src = (tree / "main.hip").read_text()
    base = _key(target, src, source_dir=tree)
    assert _key(target, src, source_dir=tree) == base
    (tree / "inc" / "b.h").write_text('#include "../common/c.h"\n#define B_VAL (C_VAL + 1)\n')
    k2 = _key(target, src, source_dir=tree)
    assert k2 != base                                   # beside its includer, one level down
    (tree / "common" / "c.h").write_text("#define C_VAL 2\n")
    assert _key(target, src, source_dir=tree) not in (base, k2)     # through "../", two levels down


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("spelling", [["-I{d}"], ["-I", "{d}"], ["--include-path={d}"], ["-isystem", "{d}"]])
def test_include_dir_given_as_an_option(tree, target, spelling):
    src = '#include "x.h"\n#include <sub/y.h>\n__global__ void k(int* p){ p[0] = X_VAL + Y_VAL; }\n'
    opts = [o.format(d=tree / "extra") for o in spelling]
    base = _key(target, src, options=opts)
    (tree / "extra" / "x.h").write_text("#define X_VAL 2\n")
    k2 = _key(target, src, options=opts)
    assert k2 != base
    (tree / "extra" / "sub" / "y.h").write_text("#define Y_VAL 2\n")
    assert _key(target, src, options=opts) not in (base, k2)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("how", ["in source", "as a define", "function-like"])
def test_macro_include(tree, target, how):
    if how == "in source":
        src, opts = '#define HDR "sub/y.h"\n#include HDR\n__global__ void k(int* p){ p[0] = Y_VAL; }\n', []
    elif how == "as a define":
        src, opts = "#include HDR\n__global__ void k(int* p){ p[0] = Y_VAL; }\n", ['-DHDR="sub/y.h"']
    else:
        src = '#define STR(x) #x\n#define PATH(x) STR(sub/x.h)\n#include PATH(y)\n__global__ void k(int*p){p[0]=Y_VAL;}\n'
        opts = []
    d = [tree / "extra"]
    base = _key(target, src, options=opts, include_dirs=d)
    (tree / "extra" / "sub" / "y.h").write_text("#define Y_VAL 3\n")
    assert _key(target, src, options=opts, include_dirs=d) != base


@pytest.mark.parametrize("target", TARGETS)
def test_pre_included_file(tree, target):
    src = "__global__ void k(int* p){ p[0] = X_VAL; }\n"
    opts = ["-include", str(tree / "extra" / "x.h")]
    base = _key(target, src, options=opts)
    (tree / "extra" / "x.h").write_text("#define X_VAL 5\n")
    assert _key(target, src, options=opts) != base


@pytest.mark.parametrize("target", TARGETS)
def test_header_appearing_earlier_on_the_path_changes_the_key(tree, target):
    src = '#include "x.h"\n__global__ void k(int* p){ p[0] = X_VAL; }\n'
    first = tree / "first"
    first.mkdir()
    dirs = [first, tree / "extra"]
    base = _key(target, src, include_dirs=dirs)
    (first / "x.h").write_text("#define X_VAL 9\n")               # now shadows extra/x.h
    assert _key(target, src, include_dirs=dirs) != base


def test_working_directory_header_of_inline_source(tree, monkeypatch):
    # NVRTC finds a quoted include of an in-memory source in the working directory
    (tree / "work_local.h").write_text("#define W 1\n")
    monkeypatch.chdir(tree)
    src = '#include "work_local.h"\n__global__ void k(int* p){ p[0] = W; }\n'
    base = _key("sm_90a", src)
    (tree / "work_local.h").write_text("#define W 2\n")
    assert _key("sm_90a", src) != base


def test_key_does_not_depend_on_where_the_tree_lives(tree, tmp_path):
    src = (tree / "main.hip").read_text()
    base = _key("sm_90a", src, source_dir=tree, include_dirs=[tree / "extra"])
    moved = tmp_path / "elsewhere"
    shutil.copytree(tree, moved)
    assert _key("sm_90a", src, source_dir=moved, include_dirs=[moved / "extra"]) == base


def test_unrelated_file_in_an_include_dir_does_not_change_a_plain_key(tree):
    src = (tree / "main.hip").read_text()
    base = _key("sm_90a", src, source_dir=tree)
    (tree / "notes.txt").write_text("unrelated")
    assert _key("sm_90a", src, source_dir=tree) == base


def test_compile_never_serves_the_old_binary(fresh_cache, tree):
    """End to end for sm_90a: each kind of edit gives a new code object that holds the new value."""
    co1 = rocjit.compile(tree / "main.hip", "sm_90a")
    (tree / "common" / "c.h").write_text("#define C_VAL 12345\n")
    co2 = rocjit.compile(tree / "main.hip", "sm_90a")
    assert co2.key != co1.key and co2.binary != co1.binary
    src = "#include HDR\n__global__ void k(int* p){ p[0] = Y_VAL; }\n"
    co3 = rocjit.compile(src, "sm_90a", options=['-DHDR="sub/y.h"', f"-I{tree / 'extra'}"])
    (tree / "extra" / "sub" / "y.h").write_text("#define Y_VAL 777\n")
    co4 = rocjit.compile(src, "sm_90a", options=['-DHDR="sub/y.h"', f"-I{tree / 'extra'}"])
    assert co4.key != co3.key and co4.binary != co3.binary
    assert cache.info()["misses"] == 4


def test_compile_never_serves_the_old_binary_gfx942(fresh_cache, tree):
    """A macro include through an -I directory, end to end on gfx942 (offline clang toolchain)."""
    import os
    from rocjit import toolchain
    if toolchain.find() is None:
        if os.environ.get("ROCJIT_REQUIRE_AMD") == "1":
            pytest.fail("ROCJIT_REQUIRE_AMD=1 but the offline AMD toolchain is not installed")
        pytest.skip("the offline AMD toolchain is not installed (python -m rocjit toolchain install)")
    src = "#include HDR\n__global__ void k(int* p){ p[0] = Y_VAL; }\n"
    opts = ['-DHDR="sub/y.h"', f"-I{tree / 'extra'}"]
    co3 = rocjit.compile(src, "gfx942", options=opts)
    (tree / "extra" / "sub" / "y.h").write_text("#define Y_VAL 777\n")
    co4 = rocjit.compile(src, "gfx942", options=opts)
    assert co4.key != co3.key and co4.binary != co3.binary


def test_macro_include_over_a_huge_directory_is_bounded(tree, monkeypatch):
    src = "#include HDR\n__global__ void k(int* p){ p[0] = Y_VAL; }\n"
    d = [tree / "extra"]
    monkeypatch.setattr(compiler, "_TREE_CONTENT_LIMIT", 1)      # past it: size and mtime stand in for content
    with pytest.warns(RuntimeWarning, match="every file under its include directories"):
        base = _key("sm_90a", src, options=['-DHDR="sub/y.h"'], include_dirs=d)
        (tree / "extra" / "sub" / "y.h").write_text("#define Y_VAL 12345\n")
        assert _key("sm_90a", src, options=['-DHDR="sub/y.h"'], include_dirs=d) != base
    monkeypatch.setattr(compiler, "_TREE_WALK_LIMIT", 2)         # past it: never cached rather than walked on
    with pytest.warns(RuntimeWarning, match="without the on-disk cache"):
        k1 = _key("sm_90a", src, options=['-DHDR="sub/y.h"'], include_dirs=d)
        k2 = _key("sm_90a", src, options=['-DHDR="sub/y.h"'], include_dirs=d)
    assert k1 != k2


def test_deleted_working_directory_does_not_break_the_key(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert _key("sm_90a", '#include "x.h"\n#include HDR\n__global__ void k(){}\n')
