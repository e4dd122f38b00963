"""The offline clang toolchain (rocjit.toolchain installs it): HIP C++ -> AMD code object for gfx90a, gfx942 and
gfx950 (MI200 / MI300X / MI355X), without ROCm or a GPU. clang reports an unknown target as an error."""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from rocjit import codeobject, targets, toolchain
from rocjit.errors import CompileError
from rocjit.platform import Compiled

NAME = "clang"
COMPILE_TIMEOUT_S = 600


def version() -> str:
    return toolchain.require().version


def shim_dirs() -> list[str]:
    return []


def _name_expression_probes(name_expressions) -> str:
    """Device pointers to each requested kernel: they force the template instantiation, and the
    relocation of each pointer names the mangled symbol (clang has no lowering API)."""
    lines = ["", "// rocjit: instantiate the requested kernels and record their symbols", 'extern "C" {']
    for i, expr in enumerate(name_expressions):
        kernel = expr.strip().lstrip("&").strip()
        lines.append(f"__device__ __attribute__((used)) void* __rocjit_name_expr_{i} = (void*)&{kernel};")
    return "\n".join(lines + ["}"]) + "\n"


def _command(tc: toolchain.Toolchain, target, options, include_dirs, src: Path, out: Path) -> list[str]:
    cmd = [str(tc.clang), "-x", "hip", "--cuda-device-only", "--no-gpu-bundle-output", "-c", "-O3",
           f"--offload-arch={target}", f"--rocm-path={tc.tree / 'usr'}", f"--rocm-device-lib-path={tc.bitcode_dir}",
           # the 6.4 HIP headers must win over a system-wide ROCm 5.2 /usr/include/hip
           "-isystem", str(tc.include_dir),
           # clang 22 stopped predefining this but the HIP headers read it (gfx9: 64; RDNA compiles wave32)
           f"-D__AMDGCN_WAVEFRONT_SIZE={targets.wave_size(target)}", "-mcode-object-version=5"]
    if not any(str(o).startswith(("-std=", "--std=")) for o in options):
        cmd.append("-std=c++17")
    cmd += [f"-I{d}" for d in include_dirs] + [str(o) for o in options]
    return cmd + [str(src), "-o", str(out)]


def compile(source: str, *, target: str, options=(), include_dirs=(), name_expressions=(),
            filename: str = "<source>", tc: toolchain.Toolchain | None = None) -> Compiled:
    tc = tc or toolchain.require()
    compiler = f"clang-{toolchain.LLVM_MAJOR} ({tc.version})"
    base = os.path.basename(filename) if filename and not filename.startswith("<") else "source.hip"
    with tempfile.TemporaryDirectory(prefix="rocjit-clang-") as tmp:
        src, out = Path(tmp) / base, Path(tmp) / "out.hsaco"
        src.write_text(source + (_name_expression_probes(name_expressions) if name_expressions else ""))
        cmd = _command(tc, target, options, include_dirs, src, out)
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
    symbols = codeobject.elf_symbols(binary)
    dynamic = codeobject.elf_symbols(binary, dynamic=True)
    functions = {s.value: s.name for s in symbols if s.type == codeobject.STT_FUNC}
    relocations = {r_offset: (sym, addend) for r_offset, sym, _type, addend in codeobject.elf_relocations(binary)}
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
