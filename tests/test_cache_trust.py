"""The cache as a hostile local user meets it: directories that are not the user's own and private are refused
(with a private fallback and a warning that says why), native code is never loaded from them, files are never
followed through symlinks, and every kind of damage is recovered with a warning instead of an exception."""
import hashlib
import json
import os
import stat
import subprocess
import sys
import textwrap
import warnings

import pytest

import rocjit
from rocjit import cache, compiler, tune

ROOT = os.geteuid() == 0
OTHER_UID = 54321                       # a uid that is not ours (only root can give files to it)
needs_root = pytest.mark.skipif(not ROOT, reason="giving a directory to another uid needs root (os.chown)")
SRC = "#include <hip/hip_runtime.h>\n__global__ void k(int* p){ p[0] = 42; }\n"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def fresh(fresh_cache):
    cache._warned.clear()
    yield fresh_cache
    cache._warned.clear()


def _resolve(path, monkeypatch):
    monkeypatch.setenv("ROCJIT_CACHE_DIR", str(path))
    cache._warned.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        d = cache.cache_dir()
    return d, " ".join(str(x.message) for x in w)


def _assert_private_fallback(d, configured):
    assert d != configured and str(configured) not in str(d)
    st = os.stat(d)
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700


# ----------------------------------------------------------------------------- which directories are refused
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_directory_writable_by_group_or_others_is_refused(tmp_path, monkeypatch, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    d, msg = _resolve(shared, monkeypatch)
    _assert_private_fallback(d, shared)
    assert f"not using the cache directory {shared}" in msg and "writable by group or others" in msg


@needs_root
def test_directory_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    d, msg = _resolve(theirs, monkeypatch)
    _assert_private_fallback(d, theirs)
    assert f"owned by uid {OTHER_UID}" in msg


@needs_root
def test_symlink_to_a_foreign_directory_is_refused(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    (tmp_path / "link").symlink_to(theirs)
    d, msg = _resolve(tmp_path / "link", monkeypatch)
    _assert_private_fallback(d, theirs)
    assert "owned by uid" in msg


def test_parent_writable_by_others_is_refused_unless_sticky(tmp_path, monkeypatch):
    parent = tmp_path / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)                 # anyone could rename our directory away and put theirs in its place
    d, msg = _resolve(parent / "rocjit", monkeypatch)
    _assert_private_fallback(d, parent / "rocjit")
    assert f"its parent {parent} is writable by group or others" in msg
    os.chmod(parent, 0o1777)                # sticky, as /tmp: only the owner may rename an entry
    d, msg = _resolve(parent / "rocjit", monkeypatch)
    assert d == parent / "rocjit" and msg == ""


def test_own_private_directory_and_symlink_to_it_are_used(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    d, msg = _resolve(mine, monkeypatch)
    assert d == mine and msg == "" and stat.S_IMODE(os.stat(mine).st_mode) == 0o700
    (tmp_path / "link").symlink_to(mine)
    d, msg = _resolve(tmp_path / "link", monkeypatch)
    assert d == mine and msg == ""          # the resolved path is used, so the link cannot be re-pointed later


def test_missing_parents_are_created_private(tmp_path, monkeypatch):
    old = os.umask(0o002)                   # a umask that would make new directories group-writable
    try:
        d, msg = _resolve(tmp_path / "a" / "b" / "rocjit", monkeypatch)
    finally:
        os.umask(old)
    assert d == tmp_path / "a" / "b" / "rocjit" and msg == ""
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700


def test_uncreatable_cache_falls_back_and_compiles(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("a file where a directory should be")
    monkeypatch.setenv("ROCJIT_CACHE_DIR", str(tmp_path / "file" / "rocjit"))
    cache._warned.clear()
    compiler._memory.clear()
    with pytest.warns(RuntimeWarning, match="cannot be used"):
        co = rocjit.compile(SRC, "sm_90a")
    assert co.binary[:4] == b"\x7fELF"


@pytest.mark.skipif(ROOT, reason="root writes through read-only modes, so a read-only directory cannot be arranged")
def test_read_only_cache_falls_back(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    d, msg = _resolve(ro, monkeypatch)
    _assert_private_fallback(d, ro)
    assert "not writable" in msg


def test_unwritable_entry_directory_costs_a_warning_not_the_result(fresh):
    cache.cache_dir()
    key = "ab" + "5" * 62
    (fresh / f"v{cache.SCHEMA}").mkdir()
    (fresh / f"v{cache.SCHEMA}" / "ab").write_text("a file where the entry directory belongs")
    with pytest.warns(RuntimeWarning, match="building without the lock|could not save"):
        meta, binary, hit = cache.get_or_build(key, lambda: ({"format": "cubin"}, b"built"))
    assert (binary, hit) == (b"built", False)
    assert (fresh / f"v{cache.SCHEMA}" / "ab").read_text().startswith("a file")      # not removed


# ----------------------------------------------------------------------------- a hostile user's plants
_EVIL_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void pwned(void) {
    FILE* f = fopen(getenv("ROCJIT_TEST_MARKER"), "w");
    if (f) { fputs("constructor ran", f); fclose(f); }
}
"""

_VICTIM = textwrap.dedent("""
    import sys, warnings
    warnings.simplefilter("always")
    import rocjit
    from rocjit import native
    co = rocjit.compile(sys.argv[1], "sm_90a")
    m = native.module()
    print("RESULT", co.binary[:4] == b"\\x7fELF", co.binary != b"PLANTED", m is not None, native.status())
""")


def _plant(d, key, meta, binary):
    """What an attacker with write access can write: an entry whose digest is right for its content."""
    meta = dict(meta, size=len(binary))
    meta["sha256"] = cache._digest(key, meta, binary)
    p = d / f"v{cache.SCHEMA}" / key[:2] / f"{key}.co"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(cache._MAGIC + json.dumps(meta, sort_keys=True).encode() + b"\n" + binary)


@pytest.mark.parametrize("how", ["world-writable", pytest.param("foreign-owner", marks=needs_root)])
def test_planted_native_launcher_and_code_object_are_never_used(tmp_path, how):
    from rocjit import native
    cc = native.compiler()
    if cc is None:
        pytest.skip("no C compiler to build the planted shared object with")
    shared = tmp_path / "shared"
    shared.mkdir()
    so = tmp_path / "evil.so"
    (tmp_path / "evil.c").write_text(_EVIL_C)
    subprocess.run([*cc, "-shared", "-fPIC", str(tmp_path / "evil.c"), "-o", str(so)], check=True)
    evil = so.read_bytes()
    _plant(shared, native._key(cc), {"kind": "native launcher"}, evil)
    digest = hashlib.sha256(evil).hexdigest()
    (shared / "native").mkdir()
    (shared / "native" / f"rocjit_launch_{digest[:16]}{native.sysconfig.get_config_var('EXT_SUFFIX')}") \
        .write_bytes(evil)
    key = compiler.cache_key(SRC, "sm_90a", [], compiler.include_dirs_for("sm_90a"), (), "kernel.hip")
    _plant(shared, key, {"format": "cubin", "target": "sm_90a", "lowered": {}, "log": ""}, b"PLANTED")
    for p in [shared, *shared.rglob("*")]:
        if how == "foreign-owner":
            os.chown(p, OTHER_UID, OTHER_UID)
        else:
            os.chmod(p, 0o777 if p.is_dir() else 0o666)
    marker = tmp_path / "marker"
    env = dict(os.environ, ROCJIT_CACHE_DIR=str(shared), ROCJIT_TEST_MARKER=str(marker), PYTHONPATH=REPO)
    env.pop("ROCJIT_REQUIRE_NATIVE", None)
    r = subprocess.run([sys.executable, "-c", _VICTIM, SRC], env=env, capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not marker.exists(), "the planted shared object's constructor ran in the victim's process"
    result = r.stdout.split("RESULT", 1)[1].split()
    assert result[:3] == ["True", "True", "True"], r.stdout      # real code object, real launcher, from elsewhere
    assert f"not using the cache directory {shared}" in r.stderr


def test_stats_log_symlink_is_not_followed(fresh, tmp_path):
    cache.cache_dir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (fresh / "stats.log").symlink_to(victim)
    cache.get_or_build("cd" + "3" * 62, lambda: ({}, b"x"))
    assert victim.read_text() == "precious"
    assert cache.info()["misses"] == 0          # the link is not read either


def test_stats_log_fifo_does_not_block(fresh):
    cache.cache_dir()
    os.mkfifo(fresh / "stats.log")
    cache.get_or_build("cd" + "4" * 62, lambda: ({}, b"x"))       # would hang forever on a blocking open
    assert cache.info()["hits"] == 0


def test_entry_symlink_is_not_followed(fresh, tmp_path):
    key, other = "ee" + "1" * 62, "ee" + "2" * 62
    cache.store(other, {"format": "cubin"}, b"other entry")
    p = cache._path(key)
    p.symlink_to(cache._path(other))
    with pytest.warns(RuntimeWarning, match="symbolic link"):
        assert cache.load(key) is None
    assert not os.path.lexists(p) and cache.load(other)[1] == b"other entry"


def test_entry_copied_under_another_key_is_rejected(fresh):
    key, other = "ee" + "3" * 62, "ee" + "4" * 62
    cache.store(other, {"format": "cubin"}, b"other entry")
    cache._path(key).write_bytes(cache._path(other).read_bytes())
    with pytest.warns(RuntimeWarning, match="hash mismatch"):
        assert cache.load(key) is None


@needs_root
def test_entry_owned_by_another_user_is_rebuilt(fresh):
    key = "ee" + "5" * 62
    cache.store(key, {"format": "cubin"}, b"theirs")
    os.chown(cache._path(key), OTHER_UID, OTHER_UID)
    with pytest.warns(RuntimeWarning, match=f"owned by uid {OTHER_UID}"):
        meta, binary, hit = cache.get_or_build(key, lambda: ({"format": "cubin"}, b"ours"))
    assert (binary, hit) == (b"ours", False) and os.stat(cache._path(key)).st_uid == os.geteuid()


def test_entry_writable_by_others_is_rebuilt(fresh):
    key = "ee" + "6" * 62
    cache.store(key, {"format": "cubin"}, b"old")
    os.chmod(cache._path(key), 0o666)
    with pytest.warns(RuntimeWarning, match="writable by group or others"):
        assert cache.get_or_build(key, lambda: ({"format": "cubin"}, b"new"))[1:] == (b"new", False)


# ----------------------------------------------------------------------------- damage of every kind
@pytest.mark.parametrize("header", ["[1, 2]", '"text"', "{}", '{"size": "7", "sha256": 1}', "{not json"])
def test_malformed_header_is_rebuilt(fresh, header):
    key = "aa" + "7" * 62
    cache.store(key, {"format": "cubin"}, b"payload")
    cache._path(key).write_bytes(cache._MAGIC + header.encode() + b"\npayload")
    with pytest.warns(RuntimeWarning, match="discarding corrupt cache entry"):
        assert cache.get_or_build(key, lambda: ({"format": "cubin"}, b"payload"))[2] is False


def test_header_edited_with_binary_hash_intact_is_rebuilt_by_compile(fresh):
    co = rocjit.compile(SRC, "sm_90a")
    p = cache._path(co.key)
    # the first schema's header: only the binary's hash, which still matches; the fields compile() reads are gone
    old = json.dumps({"size": len(co.binary), "sha256": hashlib.sha256(co.binary).hexdigest()}).encode()
    p.write_bytes(cache._MAGIC + old + b"\n" + co.binary)
    compiler._memory.clear()
    with pytest.warns(RuntimeWarning, match="discarding corrupt cache entry"):
        co2 = rocjit.compile(SRC, "sm_90a")
    assert co2.binary == co.binary and cache.load(co.key)[0]["format"] == "cubin"


def test_entry_path_that_is_a_directory_is_rebuilt(fresh):
    co = rocjit.compile(SRC, "sm_90a")
    p = cache._path(co.key)
    p.unlink()
    (p / "inside").mkdir(parents=True)
    compiler._memory.clear()
    with pytest.warns(RuntimeWarning, match="is a directory"):
        co2 = rocjit.compile(SRC, "sm_90a")
    assert co2.binary == co.binary and p.is_file()


def test_broken_native_entry_with_consistent_hash_is_rebuilt(fresh):
    from rocjit import native
    cc = native.compiler()
    if cc is None:
        pytest.skip("no C compiler: the native launcher cannot be built here")
    env = dict(os.environ, ROCJIT_CACHE_DIR=str(fresh), PYTHONPATH=REPO)
    env.pop("ROCJIT_REQUIRE_NATIVE", None)
    code = "from rocjit import native; m = native.module(); print('RESULT', m is not None, native.status())"
    cache.cache_dir()
    cache.store(native._key(cc), {"kind": "native launcher"}, b"\x7fELF but not a shared object")
    r = subprocess.run([sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert "RESULT True ready" in r.stdout, r.stdout + r.stderr
    assert "the cached native launcher does not load" in r.stderr
    r = subprocess.run([sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert "RESULT True ready" in r.stdout and "does not load" not in r.stderr     # the rebuilt entry is kept


def test_published_native_file_replaced_by_a_symlink_is_not_followed(fresh, tmp_path):
    from rocjit import native
    cc = native.compiler()
    if cc is None:
        pytest.skip("no C compiler: the native launcher cannot be built here")
    env = dict(os.environ, ROCJIT_CACHE_DIR=str(fresh), PYTHONPATH=REPO)
    env.pop("ROCJIT_REQUIRE_NATIVE", None)
    code = "from rocjit import native; m = native.module(); print('RESULT', m is not None, native.status())"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "RESULT True ready" in r.stdout, r.stderr
    published, = (fresh / "native").iterdir()
    target = tmp_path / "elsewhere.so"
    target.write_bytes(b"not ours")
    published.unlink()
    published.symlink_to(target)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "RESULT True ready" in r.stdout, r.stderr
    assert not published.is_symlink() and target.read_bytes() == b"not ours"


def test_tune_json_as_a_directory_is_survived(fresh, monkeypatch):
    monkeypatch.delenv("ROCJIT_AUTOTUNE", raising=False)
    tune.clear_memory()
    cache.cache_dir()
    (fresh / "tune.json" / "keep").mkdir(parents=True)
    calls = []
    with pytest.warns(UserWarning, match="tune.json"):
        cfg = tune.pick("op", bucket="b", dtype="bf16", device="FakeGPU", src_hash="h",
                        candidates=[{"t": 1}, {"t": 2}], default={"t": 1},
                        bench=lambda c: calls.append(c) or float(c["t"]), progress=False)
    assert cfg == {"t": 1} and len(calls) == 4                      # a warm pass, then one timing each
    assert (fresh / "tune.json" / "keep").is_dir()                  # nothing the user owns is removed
    assert tune.pick("op", bucket="b", dtype="bf16", device="FakeGPU", src_hash="h",
                     candidates=[{"t": 1}, {"t": 2}], default={"t": 1}, bench=None, progress=False) == {"t": 1}
    tune.clear_memory()


def test_tune_json_symlink_is_not_followed(fresh, tmp_path, monkeypatch):
    monkeypatch.delenv("ROCJIT_AUTOTUNE", raising=False)
    tune.clear_memory()
    cache.cache_dir()
    victim = tmp_path / "victim.json"
    victim.write_text(json.dumps({"schema": 1, "entries": {}}))
    (fresh / "tune.json").symlink_to(victim)
    with pytest.warns(UserWarning, match="symbolic link"):
        tune.pick("op", bucket="b", dtype="bf16", device="FakeGPU", src_hash="h", candidates=[{"t": 1}],
                  default={"t": 1}, bench=lambda c: 1.0, progress=False)
    assert json.loads(victim.read_text()) == {"schema": 1, "entries": {}}
    assert not (fresh / "tune.json").is_symlink()          # replaced by our own file, the link itself only
    tune.clear_memory()


def test_entry_directory_symlink_is_not_followed(fresh, tmp_path):
    cache.cache_dir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (fresh / f"v{cache.SCHEMA}").mkdir()
    (fresh / f"v{cache.SCHEMA}" / "ac").symlink_to(elsewhere)
    with pytest.warns(RuntimeWarning, match="not a directory"):
        assert cache.get_or_build("ac" + "8" * 62, lambda: ({}, b"built"))[1:] == (b"built", False)
    assert list(elsewhere.iterdir()) == []               # nothing written through the link
