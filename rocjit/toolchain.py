"""AMD compilers: hipRTC (hip-python) and an offline clang toolchain for MI300X / MI355X codegen.

`python -m rocjit toolchain install` puts clang-22 (Debian bookworm-security) with ROCm 7.0
device bitcode and HIP 6.4 headers (Debian forky) into a cache dir: the .debs are fetched with
`apt-get download` under a private apt configuration (own sources list, package lists and
status file; the system's apt setup is never touched) and unpacked with `dpkg-deb -x`.

`compile_amd()` picks the compiler per target: hipRTC when it is usable and new enough for the
target (Debian's ROCm 5.2 hipRTC handles gfx90a but crashes on gfx942), else the offline clang.
ROCJIT_AMD_COMPILER=hiprtc|clang forces one.
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
from rocjit.platform import Compiled

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
COMPILE_TIMEOUT_S = 600
# hipRTC versions (major, minor) that generate code for a target; older ones are skipped.
HIPRTC_MIN_VERSION = {"gfx942": (6, 0), "gfx950": (7, 0)}
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
    for target in ("gfx90a", "gfx942", "gfx950"):
        _clang_compile(tc, SMOKE_TEST, target=target, options=(), include_dirs=(), name_expressions=(),
                       filename="smoke.hip")
    log("  smoke test: a kernel compiled for gfx90a, gfx942 and gfx950")


def _clear_caches():
    _find_cached.cache_clear()
    compiler_version.cache_clear()


# ----------------------------------------------------------------------------------------
# Compiling

def _hiprtc_version() -> tuple[int, int] | None:
    """(major, minor) of a usable hipRTC, or None."""
    try:
        from rocjit.platform import hip
        if not hip.hiprtc_usable():
            return None
        text = hip.compiler_version().split()[1]
        major, minor = text.split(".")[:2]
        return int(major), int(minor)
    except Exception:
        return None


def choose_compiler(target: str) -> str:
    """'hiprtc' or 'clang' for `target` (see the module docstring for the policy)."""
    if not target.startswith("gfx"):
        raise ValueError(f"target {target!r} is not an AMD gfx target")
    forced = os.environ.get("ROCJIT_AMD_COMPILER", "").strip().lower()
    if forced not in ("", "hiprtc", "clang"):
        raise ValueError(f"ROCJIT_AMD_COMPILER={forced!r}: expected 'hiprtc' or 'clang'")
    version = _hiprtc_version() if forced != "clang" else None
    new_enough = version is not None and version >= HIPRTC_MIN_VERSION.get(target, (0, 0))
    if forced == "hiprtc":
        if version is None:
            from rocjit.platform import hip
            raise PlatformError(f"ROCJIT_AMD_COMPILER=hiprtc but hipRTC is not usable: {hip.hiprtc_status()[1]}")
        if not new_enough:
            need = ".".join(map(str, HIPRTC_MIN_VERSION[target]))
            raise PlatformError(f"ROCJIT_AMD_COMPILER=hiprtc but hipRTC {version[0]}.{version[1]} cannot compile "
                                f"{target} (it needs ROCm >= {need}; older ones crash). Use the offline clang: {INSTALL_HINT}")
        return "hiprtc"
    if forced == "clang" or not new_enough:
        return "clang"
    return "hiprtc"


@functools.lru_cache(maxsize=None)
def _compiler_version(target: str, forced: str, stamp) -> str:
    if choose_compiler(target) == "hiprtc":
        from rocjit.platform import hip
        return hip.compiler_version()
    return require().version


def compiler_version(target: str) -> str:
    """The compiler that builds `target`, with versions (part of the code-object cache key)."""
    tc = find()
    return _compiler_version(target, os.environ.get("ROCJIT_AMD_COMPILER", ""), tc.version if tc else None)


compiler_version.cache_clear = _compiler_version.cache_clear


def compile_amd(source: str, *, target: str, options=(), include_dirs=(), name_expressions=(),
                filename: str = "<source>") -> Compiled:
    """source -> hsaco for an AMD target, through hipRTC or the offline clang (choose_compiler)."""
    if choose_compiler(target) == "hiprtc":
        from rocjit.platform import hip
        return hip.compile(source, target=target, options=options, include_dirs=include_dirs,
                           name_expressions=name_expressions, filename=filename)
    return _clang_compile(require(), source, target=target, options=options, include_dirs=include_dirs,
                          name_expressions=name_expressions, filename=filename)


def _name_expression_probes(name_expressions) -> str:
    """Device pointers to each requested kernel: they force the template instantiation, and the
    relocation of each pointer names the mangled symbol (clang has no lowering API)."""
    lines = ["", "// rocjit: instantiate the requested kernels and record their symbols", 'extern "C" {']
    for i, expr in enumerate(name_expressions):
        kernel = expr.strip().lstrip("&").strip()
        lines.append(f"__device__ __attribute__((used)) void* __rocjit_name_expr_{i} = (void*)&{kernel};")
    return "\n".join(lines + ["}"]) + "\n"


def _clang_command(tc: Toolchain, target, options, include_dirs, src: Path, out: Path) -> list[str]:
    cmd = [str(tc.clang), "-x", "hip", "--cuda-device-only", "--no-gpu-bundle-output", "-c", "-O3",
           f"--offload-arch={target}", f"--rocm-path={tc.tree / 'usr'}", f"--rocm-device-lib-path={tc.bitcode_dir}",
           # the 6.4 HIP headers must win over a system-wide ROCm 5.2 /usr/include/hip
           "-isystem", str(tc.include_dir),
           # gfx9 is wave64; clang 22 stopped predefining this but the HIP headers read it
           "-D__AMDGCN_WAVEFRONT_SIZE=64", "-mcode-object-version=5"]
    if not any(str(o).startswith(("-std=", "--std=")) for o in options):
        cmd.append("-std=c++17")
    cmd += [f"-I{d}" for d in include_dirs] + [str(o) for o in options]
    return cmd + [str(src), "-o", str(out)]


def _clang_compile(tc: Toolchain, source: str, *, target, options, include_dirs, name_expressions,
                   filename) -> Compiled:
    compiler = f"clang-{LLVM_MAJOR} ({tc.version})"
    base = os.path.basename(filename) if filename and not filename.startswith("<") else "source.hip"
    with tempfile.TemporaryDirectory(prefix="rocjit-clang-") as tmp:
        src, out = Path(tmp) / base, Path(tmp) / "out.hsaco"
        src.write_text(source + (_name_expression_probes(name_expressions) if name_expressions else ""))
        cmd = _clang_command(tc, target, options, include_dirs, src, out)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=tc.env, timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise CompileError(f"clang did not finish within {COMPILE_TIMEOUT_S} s", source, filename, target, compiler)
        log = (proc.stderr + proc.stdout).replace(str(src), filename)
        if proc.returncode != 0 or not out.exists():
            raise CompileError(log or f"clang exited with {proc.returncode}", source, filename, target, compiler)
        binary = out.read_bytes()
    lowered = {}
    if name_expressions:
        symbols = _probe_targets(binary, len(name_expressions))
        for i, expr in enumerate(name_expressions):
            if i not in symbols:
                raise CompileError(f"could not find the kernel symbol for name expression {expr!r}",
                                   source, filename, target, compiler)
            lowered[expr] = symbols[i]
    return Compiled(binary=binary, format="hsaco", target=target, lowered=lowered, log=log)


def _probe_targets(binary: bytes, count: int) -> dict:
    """{probe index: mangled kernel name}, following each probe pointer's relocation."""
    from rocjit.platform import hip
    symbols = hip.elf_symbols(binary)
    dynamic = hip.elf_symbols(binary, dynamic=True)
    functions = {s.value: s.name for s in symbols if s.type == hip.STT_FUNC}
    relocations = {r_offset: (sym, addend) for r_offset, sym, _type, addend in hip.elf_relocations(binary)}
    found = {}
    prefix = "__rocjit_name_expr_"
    for s in symbols:
        if not s.name.startswith(prefix):
            continue
        index = int(s.name[len(prefix):])
        if s.value not in relocations:
            continue
        sym, addend = relocations[s.value]
        if sym:   # absolute relocation against a named symbol
            found[index] = dynamic[sym].name
        elif addend in functions:   # relative relocation: the addend is the kernel's address
            found[index] = functions[addend]
    return found


# ----------------------------------------------------------------------------------------
# Status and CLI

def status() -> dict:
    """Which AMD compilers are usable, their versions and paths (for `python -m rocjit`)."""
    from rocjit.platform import hip
    usable, detail = hip.hiprtc_status()
    out = {"hiprtc": {"usable": usable, "library" if usable else "reason": detail}}
    if usable:
        out["hiprtc"]["version"] = hip.compiler_version()
    tc = find()
    out["clang"] = {"installed": tc is not None, "dir": str(toolchain_dir())}
    if tc:
        out["clang"].update(path=str(tc.clang), version=tc.version)
    else:
        out["clang"]["hint"] = INSTALL_HINT
    targets = {}
    for target in ("gfx90a", "gfx942", "gfx950"):
        try:
            compiler = choose_compiler(target)
            targets[target] = compiler if compiler == "hiprtc" or tc else "clang (not installed)"
        except (PlatformError, ValueError) as e:
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
