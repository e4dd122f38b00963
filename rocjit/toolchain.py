"""AMD compilers: hipRTC (hip-python) and an offline clang toolchain for MI300X / MI355X codegen.

`python -m rocjit toolchain install` puts clang-22 (Debian bookworm-security) with ROCm 7.0
device bitcode and HIP 6.4 headers (Debian forky) into a cache dir: the .debs are fetched with
`apt-get download` under a private apt configuration (own sources list, package lists and
status file; the system's apt setup is never touched) and unpacked with `dpkg-deb -x`.

rocjit.compilers.clang compiles with it; rocjit.compilers.compiler_for() decides when.
"""
from __future__ import annotations

import argparse
import fcntl
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rocjit.errors import CompileError, PlatformError

LLVM_MAJOR = 22
# (package, suite): clang 22 knows gfx950; the device bitcode and HIP headers must be newer
# than bookworm's ROCm 5.2 for gfx950 and hip_fp8.h.
PACKAGES = (
    ("clang-22", "bookworm-security"),
    ("libclang-cpp22", "bookworm-security"),
    ("libllvm22", "bookworm-security"),
    ("libclang-common-22-dev", "bookworm-security"),
    ("lld-22", "bookworm-security"),
    ("llvm-22", "bookworm-security"),
    ("rocm-device-libs-21", "forky"),
    ("libamdhip64-dev", "forky"),
)
# Shared libraries clang-22 needs, by soname -> bookworm package; fetched only when missing.
RUNTIME_LIBRARIES = {
    "libz3.so.4": "libz3-4", "libedit.so.2": "libedit2", "libxml2.so.2": "libxml2",
    "libicuuc.so.72": "libicu72", "libicudata.so.72": "libicu72", "libffi.so.8": "libffi8",
    "libzstd.so.1": "libzstd1", "libbsd.so.0": "libbsd0", "libmd.so.0": "libmd0",
    "libtinfo.so.6": "libtinfo6", "liblzma.so.5": "liblzma5", "libz.so.1": "zlib1g",
}
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
MANIFEST = "manifest.json"
INSTALL_HINT = "python -m rocjit toolchain install"


class ToolchainMissingError(PlatformError):
    """The offline clang toolchain is needed for a target but is not installed."""


def toolchain_dir() -> Path:
    """ROCJIT_TOOLCHAIN_DIR, else ~/.cache/rocjit/toolchain (XDG_CACHE_HOME respected)."""
    env = os.environ.get("ROCJIT_TOOLCHAIN_DIR")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "rocjit" / "toolchain"


@dataclass(frozen=True)
class Toolchain:
    """An unpacked toolchain tree (`<dir>/tree/usr/...`) and its package versions."""
    tree: Path
    packages: dict

    @property
    def bin_dir(self) -> Path:
        return self.tree / "usr" / "lib" / f"llvm-{LLVM_MAJOR}" / "bin"

    @property
    def clang(self) -> Path:
        return self.bin_dir / "clang"

    def tool(self, name: str) -> Path:
        """llvm-objdump, llvm-readelf, llvm-cxxfilt, ... from the toolchain."""
        return self.bin_dir / name

    @property
    def include_dir(self) -> Path:
        return self.tree / "usr" / "include"

    @property
    def bitcode_dir(self) -> Path:
        found = sorted(self.tree.glob("usr/lib/llvm-*/lib/clang/*/amdgcn/bitcode"))
        if not found:
            raise ToolchainMissingError(f"no AMD device bitcode under {self.tree}; reinstall with: {INSTALL_HINT} --force")
        return found[-1]

    @property
    def env(self) -> dict:
        """Environment for running the unpacked binaries (their libraries are not in ld.so's path)."""
        lib_dirs = [self.tree / "usr" / "lib" / "x86_64-linux-gnu", self.tree / "usr" / "lib" / f"llvm-{LLVM_MAJOR}" / "lib"]
        lib_dirs += sorted(self.tree.glob("usr/lib/*-linux-gnu"))
        env = dict(os.environ)
        paths = [str(p) for p in dict.fromkeys(lib_dirs)]
        if env.get("LD_LIBRARY_PATH"):
            paths.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(paths)
        return env

    @property
    def version(self) -> str:
        p = self.packages
        return (f"clang {p.get(f'clang-{LLVM_MAJOR}', '?')}, device-libs {p.get('rocm-device-libs-21', '?')}, "
                f"hip headers {p.get('libamdhip64-dev', '?')}")


def _read_manifest(root: Path) -> dict | None:
    try:
        return json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=8)
def _find_cached(root: str, stamp: float) -> Toolchain | None:
    from rocjit import cache
    try:        # clang runs from here: a directory someone else can write is no toolchain of ours
        cache.trusted_dir(root)
    except ValueError as e:
        import warnings
        warnings.warn(f"rocjit: the AMD toolchain in {root} is not used: {e}; reinstall it into a directory only you "
                      f"can write (ROCJIT_TOOLCHAIN_DIR)", RuntimeWarning, stacklevel=3)
        return None
    manifest = _read_manifest(Path(root))
    if not manifest or manifest.get("llvm_major") != LLVM_MAJOR:
        return None
    tc = Toolchain(Path(root) / "tree", manifest.get("packages", {}))
    return tc if tc.clang.exists() else None


def find() -> Toolchain | None:
    """The installed toolchain, or None (cheap: one stat of the manifest)."""
    root = toolchain_dir()
    try:
        stamp = (root / MANIFEST).stat().st_mtime
    except OSError:
        return None
    return _find_cached(str(root), stamp)


def require() -> Toolchain:
    tc = find()
    if tc is None:
        raise ToolchainMissingError(
            f"the offline AMD clang toolchain is not installed in {toolchain_dir()} (needed for gfx942/gfx950 "
            f"code without a new enough hipRTC). Install it (about 65 MB download, no root needed) with:\n"
            f"    {INSTALL_HINT}\n"
            f"or set ROCJIT_TOOLCHAIN_DIR to where it is installed.")
    return tc


# ----------------------------------------------------------------------------------------
# Installation

def _apt_options(apt: Path) -> list[str]:
    """apt-get options that read and write only under `apt` (never the system's apt state)."""
    opts = {
        "Dir::Etc::SourceList": apt / "sources.list",
        "Dir::Etc::SourceParts": apt / "empty",
        "Dir::Etc::Preferences": apt / "preferences",
        "Dir::Etc::PreferencesParts": apt / "empty",
        "Dir::State": apt / "state",
        "Dir::State::Lists": apt / "lists",
        "Dir::State::status": apt / "status",
        "Dir::Cache": apt / "cache",
        "Debug::NoLocking": "1",
        "Acquire::Languages": "none",
        "APT::Get::List-Cleanup": "0",
    }
    if os.geteuid() == 0:
        # Root drops to the _apt user for downloads, who cannot write into a private home dir.
        opts["APT::Sandbox::User"] = "root"
    out = []
    for key, value in opts.items():
        out += ["-o", f"{key}={value}"]
    return out


def _write_apt_config(apt: Path):
    for d in ("empty", "state", "lists/partial", "cache/archives/partial"):
        (apt / d).mkdir(parents=True, exist_ok=True)
    (apt / "status").touch()
    (apt / "preferences").touch()
    mirror = os.environ.get("ROCJIT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    security = os.environ.get("ROCJIT_DEBIAN_SECURITY_MIRROR", "http://deb.debian.org/debian-security")
    signed = f"[signed-by={KEYRING}]"
    (apt / "sources.list").write_text(
        f"deb {signed} {mirror} bookworm main\n"
        f"deb {signed} {security} bookworm-security main\n"
        f"deb {signed} {mirror} forky main\n")


def _run(cmd, log, **kwargs):
    if os.environ.get("ROCJIT_VERBOSE"):
        log("  $ " + " ".join(str(c) for c in cmd))
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        raise PlatformError(f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stdout}{proc.stderr}")
    return proc


def _download(apt: Path, specs: list[str], dest: Path, log):
    dest.mkdir(parents=True, exist_ok=True)
    _run(["apt-get", *_apt_options(apt), "-q", "download", *specs], log, cwd=dest)


def _extract_all(debs: Path, tree: Path, log) -> dict:
    versions = {}
    for deb in sorted(debs.glob("*.deb")):
        log(f"  unpacking {deb.name.split('_')[0]}")
        _run(["dpkg-deb", "-x", deb, tree], log)
        fields = _run(["dpkg-deb", "-f", deb, "Package", "Version"], lambda _: None).stdout
        info = dict(line.split(": ", 1) for line in fields.strip().splitlines() if ": " in line)
        versions[info.get("Package", deb.name)] = info.get("Version", "?")
    return versions


def _missing_libraries(tc: Toolchain) -> list[str]:
    proc = subprocess.run(["ldd", str(tc.clang.resolve())], capture_output=True, text=True, env=tc.env)
    return [line.split("=>")[0].strip() for line in proc.stdout.splitlines() if "not found" in line]


SMOKE_TEST = """#include <hip/hip_runtime.h>
extern "C" __global__ void rocjit_smoke(float* y) { y[threadIdx.x] = __shfl_xor(1.0f, 1); }
"""


@contextmanager
def _locked(root: Path):
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def install(force: bool = False, log=print) -> Toolchain:
    """Download and unpack the toolchain into toolchain_dir(); a no-op when already installed."""
    root = toolchain_dir()
    existing = find()
    wanted = sorted(p for p, _ in PACKAGES)
    if existing and not force and sorted(p for p in wanted if p in existing.packages) == wanted:
        log(f"AMD toolchain already installed in {root} ({existing.version})")
        return existing
    for tool in ("apt-get", "dpkg-deb", "ldd"):
        if shutil.which(tool) is None:
            raise PlatformError(f"installing the AMD toolchain needs `{tool}` (a Debian or Ubuntu system)")
    if not os.path.exists(KEYRING):
        raise PlatformError(f"{KEYRING} is missing: install the debian-archive-keyring package")
    started = time.time()
    with _locked(root):
        existing = find()
        if existing and not force and sorted(p for p in wanted if p in existing.packages) == wanted:
            log(f"AMD toolchain already installed in {root} ({existing.version})")
            return existing
        work = Path(tempfile.mkdtemp(prefix="install-", dir=root))
        try:
            apt, debs, tree = work / "apt", work / "debs", work / "tree"
            _write_apt_config(apt)
            log("fetching package lists (bookworm, bookworm-security, forky) into a private apt state")
            _run(["apt-get", *_apt_options(apt), "-q", "update"], log)
            log(f"downloading {len(PACKAGES)} packages")
            _download(apt, [f"{p}/{suite}" for p, suite in PACKAGES], debs, log)
            versions = _extract_all(debs, tree, log)
            tc = Toolchain(tree, versions)
            missing = _missing_libraries(tc)
            if missing:
                unknown = [m for m in missing if m not in RUNTIME_LIBRARIES]
                if unknown:
                    raise PlatformError(f"clang-{LLVM_MAJOR} needs libraries this system lacks: {', '.join(unknown)}")
                extra = sorted({RUNTIME_LIBRARIES[m] for m in missing})
                log(f"adding libraries the system lacks: {', '.join(extra)}")
                shutil.rmtree(debs)
                _download(apt, [f"{p}/bookworm" for p in extra], debs, log)
                versions.update(_extract_all(debs, tree, log))
                still = _missing_libraries(tc)
                if still:
                    raise PlatformError(f"clang-{LLVM_MAJOR} still misses libraries: {', '.join(still)}")
            _smoke_test(tc, log)
            final = root / "tree"
            if final.exists():
                shutil.rmtree(final)
            os.replace(tree, final)
            manifest = {"llvm_major": LLVM_MAJOR, "packages": versions,
                        "installed": time.strftime("%Y-%m-%dT%H:%M:%S")}
            tmp = root / (MANIFEST + ".tmp")
            tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
            os.replace(tmp, root / MANIFEST)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    _clear_caches()
    tc = require()
    log(f"AMD toolchain installed in {root} in {time.time() - started:.0f} s ({tc.version})")
    return tc


def _smoke_test(tc: Toolchain, log):
    from rocjit.compilers import clang
    for target in ("gfx90a", "gfx942", "gfx950"):
        clang.compile(SMOKE_TEST, target=target, filename="smoke.hip", tc=tc)
    log("  smoke test: a kernel compiled for gfx90a, gfx942 and gfx950")


def _clear_caches():
    _find_cached.cache_clear()
    from rocjit import compiler
    compiler.compiler_version.cache_clear()


# ----------------------------------------------------------------------------------------
# Status and CLI

def status() -> dict:
    """Which AMD compilers are usable, their versions and paths (for `python -m rocjit`)."""
    from rocjit.compilers import amd_compiler_name, hiprtc
    from rocjit.errors import CompileError
    from rocjit.platform import hip
    usable, detail = hip.hiprtc_status()
    out = {"hiprtc": {"usable": usable, "library" if usable else "reason": detail}}
    if usable:
        out["hiprtc"]["version"] = hiprtc.version()
    tc = find()
    out["clang"] = {"installed": tc is not None, "dir": str(toolchain_dir())}
    if tc:
        out["clang"].update(path=str(tc.clang), version=tc.version)
    else:
        out["clang"]["hint"] = INSTALL_HINT
    targets = {}
    for target in ("gfx90a", "gfx942", "gfx950"):
        try:
            compiler = amd_compiler_name(target)
            targets[target] = compiler if compiler == "hiprtc" or tc else "clang (not installed)"
        except (PlatformError, CompileError, ValueError) as e:
            targets[target] = f"unusable: {e}"
    out["targets"] = targets
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rocjit toolchain",
                                     description="Manage the offline AMD clang toolchain (gfx90a/gfx942/gfx950).")
    sub = parser.add_subparsers(dest="command", required=True)
    p_install = sub.add_parser("install", help="download and unpack the toolchain (idempotent)")
    p_install.add_argument("--force", action="store_true", help="reinstall even if already installed")
    p_install.add_argument("--dir", help="install here instead of ROCJIT_TOOLCHAIN_DIR / ~/.cache/rocjit/toolchain")
    sub.add_parser("status", help="show the AMD compilers and which one builds each target")
    sub.add_parser("path", help="print the toolchain's clang path (exit 1 if not installed)")
    args = parser.parse_args(argv)
    if getattr(args, "dir", None):
        os.environ["ROCJIT_TOOLCHAIN_DIR"] = str(Path(args.dir).resolve())
    try:
        if args.command == "install":
            install(force=args.force)
        elif args.command == "status":
            print(json.dumps(status(), indent=2))
        elif args.command == "path":
            tc = find()
            if tc is None:
                print(f"not installed; run: {INSTALL_HINT}", file=sys.stderr)
                return 1
            print(tc.clang)
    except PlatformError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
