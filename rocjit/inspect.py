"""Resources and ISA statistics of compiled kernels, read from the code object alone (no GPU).

AMD (hsaco): registers, LDS, scratch and spills from the amdhsa metadata note; instruction counts from
`llvm-objdump -d` of the offline toolchain. NVIDIA (cubin): `cuobjdump --dump-resource-usage` and
`cuobjdump -sass` from the nvidia-cuda-cuobjdump wheel (or a CUDA toolkit); spill counts from the
ptxas lines of the compile log when it has them. A missing tool leaves its fields None.

    rocjit.inspect(kernel)              # a live Kernel, a CodeObject / Compiled, or raw bytes
    resources(code_object, kernel=None) # -> [KernelResources]
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from dataclasses import asdict, dataclass, field

# Per-target limits used for occupancy. CDNA2/3 (AMD Instinct MI200/MI300/MI350 ISA guides and the
# MI300X workload-optimization guide): a unified 512-entry VGPR file per SIMD lane (AGPRs included),
# allocated in blocks of 8 registers; at most 8 waves per SIMD (EU); 4 SIMDs per CU.
AMD_LIMITS = {
    "gfx90a": {"lds_per_cu": 64 * 1024, "vgprs": 512, "vgpr_granule": 8, "max_waves_per_eu": 8, "simds": 4},
    "gfx942": {"lds_per_cu": 64 * 1024, "vgprs": 512, "vgpr_granule": 8, "max_waves_per_eu": 8, "simds": 4},
    "gfx950": {"lds_per_cu": 160 * 1024, "vgprs": 512, "vgpr_granule": 8, "max_waves_per_eu": 8, "simds": 4},
}
# NVIDIA (CUDA occupancy calculator data): registers per SM, per-warp allocation unit, shared memory per SM,
# the 1 KB the driver reserves per block, shared allocation unit, thread / block / warp limits per SM.
NVIDIA_LIMITS = {
    90: {"regs": 65536, "reg_unit": 256, "smem": 228 * 1024, "smem_reserved": 1024, "smem_unit": 128,
         "threads": 2048, "blocks": 32, "warps": 64},
    100: {"regs": 65536, "reg_unit": 256, "smem": 228 * 1024, "smem_reserved": 1024, "smem_unit": 128,
          "threads": 2048, "blocks": 32, "warps": 64},
    80: {"regs": 65536, "reg_unit": 256, "smem": 164 * 1024, "smem_reserved": 1024, "smem_unit": 128,
         "threads": 2048, "blocks": 32, "warps": 64},
    89: {"regs": 65536, "reg_unit": 256, "smem": 100 * 1024, "smem_reserved": 1024, "smem_unit": 128,
         "threads": 1536, "blocks": 24, "warps": 48},
}
TOOL_TIMEOUT_S = 120


@dataclass
class KernelResources:
    """What one kernel uses. AMD fills vgpr/agpr/sgpr, NVIDIA fills registers; None means unknown."""
    name: str                         # the symbol (mangled) name
    target: str
    vendor: str                       # "amd" | "nvidia"
    display_name: str = ""            # demangled when a demangler is available
    registers: int | None = None      # NVIDIA registers per thread
    vgpr: int | None = None           # AMD VGPRs per lane, AGPRs included (one register file on CDNA2+)
    agpr: int | None = None           # AMD accumulation registers (the part of `vgpr` used as AGPRs)
    sgpr: int | None = None           # AMD scalar registers per wave
    shared_bytes: int | None = None   # static LDS / shared memory per block (dynamic memory comes on top)
    scratch_bytes: int | None = None  # private / local (stack) memory per thread
    spills: dict | None = None        # AMD {"vgpr", "sgpr"} spill counts; NVIDIA {"stores", "loads"} bytes
    max_threads: int | None = None    # launch bound / max flat workgroup size
    block: int | None = None          # the block size occupancy was computed for
    occupancy: dict | None = None
    isa: dict | None = None
    notes: list = field(default_factory=list)

    @property
    def spilled(self) -> bool:
        return bool(self.spills) and any(v for v in self.spills.values())

    @property
    def uses_scratch(self) -> bool:
        return bool(self.scratch_bytes)

    def as_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------------------
# Tools

def _run(cmd, **kw) -> str | None:
    try:
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, **kw)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def _nvidia_tool(name: str) -> str | None:
    """cuobjdump / nvdisasm: cuda-pathfinder, then the pip wheel's bin dir, then CUDA_HOME, then PATH."""
    try:
        from cuda import pathfinder
        found = pathfinder.find_nvidia_binary_utility(name)
        if found:
            return str(found)
    except Exception:   # pathfinder missing, too old, or the tool is not installed
        pass
    try:
        import nvidia
        for root in getattr(nvidia, "__path__", []):
            for sub in ("cu13", "cu12", "cuda_cuobjdump", "cuda_nvdisasm"):
                cand = os.path.join(root, sub, "bin", name)
                if os.access(cand, os.X_OK):
                    return cand
    except ImportError:
        pass
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cand = os.path.join(os.environ[env], "bin", name)
            if os.access(cand, os.X_OK):
                return cand
    return shutil.which(name)


def _amd_objdump():
    """(path, env) of an llvm-objdump that knows gfx950, or None."""
    try:
        from rocjit import toolchain
        tc = toolchain.find()
    except Exception:
        tc = None
    if tc is not None:
        return str(tc.tool("llvm-objdump")), tc.env
    for cand in (os.environ.get("ROCM_PATH", "/opt/rocm") + "/llvm/bin/llvm-objdump",):
        if os.access(cand, os.X_OK):
            return cand, None
    return None


@functools.lru_cache(maxsize=None)
def _demangler():
    try:
        from rocjit import toolchain
        tc = toolchain.find()
        if tc is not None and tc.tool("llvm-cxxfilt").exists():
            return str(tc.tool("llvm-cxxfilt")), tc.env
    except Exception:
        pass
    path = shutil.which("c++filt") or shutil.which("llvm-cxxfilt")
    return (path, None) if path else None


def demangle(names) -> dict:
    """{mangled: readable}; names that are not mangled (extern "C") map to themselves."""
    names = list(names)
    out = {n: n for n in names}
    tool = _demangler()
    mangled = [n for n in names if n.startswith("_Z")]
    if tool and mangled:
        try:
            proc = subprocess.run([tool[0]], input="\n".join(mangled) + "\n", capture_output=True, text=True,
                                  env=tool[1], timeout=TOOL_TIMEOUT_S)
            text = proc.stdout if proc.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            text = None
        if text:
            for n, d in zip(mangled, text.splitlines()):
                out[n] = d.strip()
    return out


# ----------------------------------------------------------------------------------------
# ISA statistics

_VARIANT_KINDS = ("global_load_128", "global_store_128", "matrix")


def _opcode_counts(opcodes, rules) -> dict:
    """Counts per rule, the total, and the exact opcodes behind the 128-bit and matrix counts."""
    counts = {name: 0 for name in rules}
    variants: dict[str, int] = {}
    total = 0
    for op in opcodes:
        total += 1
        for name, match in rules.items():
            if match(op):
                counts[name] += 1
                if name in _VARIANT_KINDS:
                    variants[op] = variants.get(op, 0) + 1
    counts["total"] = total
    counts["variants"] = dict(sorted(variants.items()))
    return counts


_AMD_RULES = {
    # 16-byte global accesses: global_/buffer_/flat_ dwordx4 (and gfx950's b128 spellings)
    "global_load_128": lambda op: re.match(r"(global|buffer|flat)_load_(lds_)?(dwordx4|b128)\b", op) is not None,
    "global_store_128": lambda op: re.match(r"(global|buffer|flat)_store_(dwordx4|b128)\b", op) is not None,
    "global_loads": lambda op: op.startswith(("global_load", "buffer_load", "flat_load")),
    "global_stores": lambda op: op.startswith(("global_store", "buffer_store", "flat_store")),
    "matrix": lambda op: op.startswith(("v_mfma", "v_smfmac")),
    "lds": lambda op: op.startswith("ds_"),
    "scratch": lambda op: op.startswith("scratch_"),
}

_NV_RULES = {
    "global_load_128": lambda op: op.startswith("LDG") and ".128" in op,
    "global_store_128": lambda op: op.startswith("STG") and ".128" in op,
    "global_loads": lambda op: op.startswith("LDG"),
    "global_stores": lambda op: op.startswith("STG"),
    "matrix": lambda op: op.split(".")[0] in ("HMMA", "HGMMA", "QGMMA", "IMMA", "IGMMA", "BGMMA", "DMMA", "OMMA",
                                               "UTCHMMA", "UTCQMMA", "UTCIMMA", "UTCOMMA"),
    "lds": lambda op: op.split(".")[0] in ("LDS", "STS", "LDSM", "STSM", "ATOMS", "LDGSTS"),
    "local": lambda op: op.split(".")[0] in ("LDL", "STL"),
}


def _amd_isa(binary: bytes) -> dict | None:
    """{kernel symbol: counts} from llvm-objdump, or None when no suitable objdump is installed."""
    tool = _amd_objdump()
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".hsaco") as f:
        f.write(binary)
        f.flush()
        text = _run([tool[0], "-d", "--no-show-raw-insn", f.name], env=tool[1])
    if text is None:
        return None
    per_kernel, current = {}, None
    for line in text.splitlines():
        head = re.match(r"^[0-9a-fA-F]+ <(.+)>:$", line)
        if head:
            current = per_kernel.setdefault(head.group(1), [])
            continue
        if current is not None and line.startswith(("\t", " ")) and line.strip():
            op = line.split()[0]
            # s_code_end is padding the assembler puts after the last function
            if not op.startswith((";", "//")) and op != "s_code_end":
                current.append(op)
    return {name: _opcode_counts(_strip_padding(ops), _AMD_RULES) for name, ops in per_kernel.items()}


def _strip_padding(ops: list[str]) -> list[str]:
    """Drop what follows a function's last s_endpgm: the s_nop / s_code_end fill that aligns the next symbol."""
    for i in range(len(ops) - 1, -1, -1):
        if ops[i] == "s_endpgm":
            return ops[:i + 1]
    return ops


def _nvidia_sass(path: str) -> tuple[dict | None, str | None]:
    """({function: counts}, arch) from `cuobjdump -sass`."""
    tool = _nvidia_tool("cuobjdump")
    if tool is None:
        return None, None
    text = _run([tool, "-sass", path])
    if text is None:
        return None, None
    arch = None
    per_kernel, current = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*code for (sm_\w+)", line)
        if m:
            arch = m.group(1)
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            current = per_kernel.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m and current is not None and m.group(1) != "NOP":   # NOPs only pad the function's end
            current.append(m.group(1))
    return {k: _opcode_counts(v, _NV_RULES) for k, v in per_kernel.items()}, arch


def _nvidia_usage(path: str) -> dict | None:
    """{function: {"REG": n, "STACK": n, "SHARED": n, "LOCAL": n, ...}} from cuobjdump."""
    tool = _nvidia_tool("cuobjdump")
    if tool is None:
        return None
    text = _run([tool, "--dump-resource-usage", path])
    if text is None:
        return None
    out, current = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):\s*$", line)
        if m:
            current = out.setdefault(m.group(1), {})
            continue
        if current is not None:
            for key, value in re.findall(r"([A-Z_]+(?:\[\d+\])?):(\d+)", line):
                current[key] = int(value)
    return out


def _ptxas_lines(log: str) -> dict:
    """{function: {"stores", "loads", "smem", "registers"}} from `ptxas -v` lines in a compile log."""
    out, current = {}, None
    for line in (log or "").splitlines():
        m = re.search(r"Function properties for (\S+)", line) or re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = out.setdefault(m.group(1), {})
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            current["stores"], current["loads"] = int(m.group(1)), int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            current["registers"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            current["smem"] = int(s.group(1)) if s else 0
    return out


# ----------------------------------------------------------------------------------------
# Occupancy

def _ceil_to(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def amd_occupancy(target: str, vgpr: int, sgpr: int, lds_bytes: int, block: int) -> dict | None:
    """Waves per SIMD (EU) and workgroups per CU for one kernel, per the CDNA occupancy rules."""
    lim = AMD_LIMITS.get(target)
    if lim is None or vgpr is None:
        return None
    max_waves = lim["max_waves_per_eu"]
    waves_vgpr = min(max_waves, lim["vgprs"] // _ceil_to(max(vgpr, 1), lim["vgpr_granule"]))
    # SGPR limit on gfx9 (800 per SIMD; LLVM's getMaxWavesPerEU table)
    waves_sgpr = max_waves if sgpr is None or sgpr <= 80 else 9 if sgpr <= 88 else 8 if sgpr <= 100 else 7
    waves_sgpr = min(waves_sgpr, max_waves)
    waves_per_eu = min(waves_vgpr, waves_sgpr)
    waves_per_wg = -(-block // 64)
    # (the per-CU workgroup cap, 16 barriers for multi-wave workgroups, never binds below: with at most 8 waves
    # per SIMD a CU holds at most 32 // waves_per_wg <= 16 of them)
    wg_regs = (waves_per_eu * lim["simds"]) // waves_per_wg if waves_per_wg else 0
    wg_lds = lim["lds_per_cu"] // lds_bytes if lds_bytes else None
    wg_per_cu = wg_regs if wg_lds is None else min(wg_regs, wg_lds)
    limits = {"vgpr": waves_vgpr, "sgpr": waves_sgpr}
    limited_by = min(limits, key=limits.get) if min(limits.values()) < max_waves else "waves"
    if wg_lds is not None and wg_lds < wg_regs:
        limited_by = "lds"
    achieved = min(waves_per_eu, wg_per_cu * waves_per_wg / lim["simds"])
    return {"waves_per_eu": round(achieved, 2), "max_waves_per_eu": max_waves, "workgroups_per_cu": wg_per_cu,
            "waves_per_eu_by_registers": waves_per_eu, "limited_by": limited_by, "block": block}


def nvidia_occupancy(target: str, registers: int, shared_bytes: int, block: int) -> dict | None:
    """Blocks and warps per SM for one kernel (CUDA occupancy calculator rules)."""
    m = re.match(r"sm_(\d+)", target or "")
    lim = NVIDIA_LIMITS.get(int(m.group(1))) if m else None
    if lim is None or registers is None or shared_bytes is None:
        return None
    warps_per_block = -(-block // 32)
    regs_per_warp = _ceil_to(max(registers, 1) * 32, lim["reg_unit"])
    by = {
        "registers": (lim["regs"] // regs_per_warp) // warps_per_block,
        "shared": lim["smem"] // _ceil_to(shared_bytes + lim["smem_reserved"], lim["smem_unit"]),
        "threads": lim["threads"] // (warps_per_block * 32),
        "blocks": lim["blocks"],
    }
    blocks = min(by.values())
    limited_by = min(by, key=by.get)
    warps = blocks * warps_per_block
    return {"blocks_per_sm": blocks, "warps_per_sm": warps, "occupancy": round(warps / lim["warps"], 3),
            "limited_by": limited_by, "block": block}


# ----------------------------------------------------------------------------------------
# Resources

def _unwrap(obj):
    """(binary, format, target, lowered, log) from a Kernel, CodeObject / Compiled, or bytes."""
    if hasattr(obj, "code_object") and hasattr(obj, "mangled_name"):
        obj = obj.code_object
    if isinstance(obj, (bytes, bytearray, memoryview)):
        binary = bytes(obj)
        fmt = "hsaco" if binary[18:20] == (224).to_bytes(2, "little") else "cubin"
        return binary, fmt, None, {}, ""
    return bytes(obj.binary), obj.format, obj.target, dict(getattr(obj, "lowered", {}) or {}), getattr(obj, "log", "") or ""


def resources(code_object, kernel: str | None = None, *, block: int | None = None,
              dynamic_shared: int = 0) -> list[KernelResources]:
    """Resources of every kernel in a code object (or just `kernel`: a mangled name or a name expression)."""
    binary, fmt, target, lowered, log = _unwrap(code_object)
    if kernel is not None:
        kernel = lowered.get(kernel, kernel)
    if fmt == "hsaco":
        rows = _amd_resources(binary, target, block, dynamic_shared)
    elif fmt == "cubin":
        rows = _nvidia_resources(binary, target, log, block, dynamic_shared)
    else:
        raise ValueError(f"cannot inspect a {fmt!r} code object: only hsaco (AMD) and cubin (NVIDIA) hold machine code")
    if kernel is not None:
        rows = [r for r in rows if r.name == kernel]
        if not rows:
            raise KeyError(f"kernel {kernel!r} is not in the code object")
    names = demangle(r.name for r in rows)
    for r in rows:
        r.display_name = names.get(r.name, r.name)
    return rows


def _amd_resources(binary, target, block, dynamic_shared) -> list[KernelResources]:
    from rocjit import codeobject
    meta = codeobject.amdhsa_metadata(binary)
    if target is None:
        target = meta.get("amdhsa.target", "").rsplit("-", 1)[-1].split(":")[0] or None
    isa = _amd_isa(binary)
    rows = []
    for k in meta.get("amdhsa.kernels", []):
        name = k[".name"]
        max_threads = k.get(".max_flat_workgroup_size")
        reqd = k.get(".reqd_workgroup_size")
        bs = block or (reqd[0] * reqd[1] * reqd[2] if reqd else None) or max_threads or 1024
        lds = k.get(".group_segment_fixed_size", 0)
        row = KernelResources(
            name=name, target=target or "?", vendor="amd",
            vgpr=k.get(".vgpr_count"), agpr=k.get(".agpr_count"), sgpr=k.get(".sgpr_count"),
            shared_bytes=lds, scratch_bytes=k.get(".private_segment_fixed_size"),
            spills={"vgpr": k.get(".vgpr_spill_count", 0), "sgpr": k.get(".sgpr_spill_count", 0)},
            max_threads=max_threads, block=bs,
            occupancy=amd_occupancy(target, k.get(".vgpr_count"), k.get(".sgpr_count"), lds + dynamic_shared, bs),
            isa=isa.get(name) if isa is not None else None)
        if k.get(".uses_dynamic_stack"):
            row.notes.append("dynamic stack (recursion or variable-sized allocas): scratch use is a lower bound")
        if isa is None:
            row.notes.append("ISA statistics need llvm-objdump: python -m rocjit toolchain install")
        if row.occupancy is None:
            row.notes.append(f"no occupancy model for {target}")
        rows.append(row)
    return rows


def _nvidia_resources(binary, target, log, block, dynamic_shared) -> list[KernelResources]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(binary)
        f.flush()
        usage = _nvidia_usage(f.name)
        sass, arch = _nvidia_sass(f.name)
    target = target or arch or "sm_?"
    ptxas = _ptxas_lines(log)
    max_threads = _nvidia_max_threads(binary)
    names = list(usage or sass or {}) or list(ptxas)
    rows = []
    for name in names:
        u = (usage or {}).get(name, {})
        p = ptxas.get(name, {})
        regs = u.get("REG", p.get("registers"))
        # cuobjdump's SHARED counts the 1 KB window sm_90+ reserves at the start of a block's shared
        # memory (user data starts at 0x400 there); ptxas -v reports the user's bytes.
        shared = p.get("smem")
        if shared is None and "SHARED" in u:
            reserve = 1024 if _sm(target) >= 90 and u["SHARED"] >= 1024 else 0
            shared = u["SHARED"] - reserve
        scratch = u.get("STACK", 0) + u.get("LOCAL", 0) if u else None
        mt = max_threads.get(name)
        bs = block or mt or 1024
        row = KernelResources(
            name=name, target=target, vendor="nvidia", registers=regs, shared_bytes=shared, scratch_bytes=scratch,
            spills={"stores": p["stores"], "loads": p["loads"]} if "stores" in p else None,
            max_threads=mt, block=bs,
            occupancy=nvidia_occupancy(target, regs, (shared or 0) + dynamic_shared, bs) if shared is not None else None,
            isa=(sass or {}).get(name))
        if usage is None:
            row.notes.append("registers / stack need cuobjdump: pip install nvidia-cuda-cuobjdump")
        if row.spills is None:
            row.notes.append("spill counts need the ptxas -v log (compile with options=['-Xptxas=-v'])")
        rows.append(row)
    return rows


def _sm(target: str) -> int:
    m = re.match(r"sm_(\d+)", target or "")
    return int(m.group(1)) if m else 0


def _nvidia_max_threads(binary: bytes) -> dict:
    """{function: max threads} from __launch_bounds__ (EIATTR_MAX_THREADS in .nv.info.<fn>)."""
    from rocjit import codeobject
    out = {}
    try:
        kernels = codeobject.nv_kernels(binary)
    except ValueError:
        return out
    for name in kernels:
        for attr, payload in codeobject.nv_info_records(binary, name):
            if attr == codeobject.EIATTR_MAX_THREADS and len(payload) >= 12:
                x, y, z = (int.from_bytes(payload[4 * j:4 * j + 4], "little") for j in range(3))
                out[name] = x * y * z
    return out


# ----------------------------------------------------------------------------------------
# Reports

def _fmt_bytes(n) -> str:
    if n is None:
        return "?"
    return f"{n / 1024:.1f}K" if n >= 1024 else str(n)


def _na(v) -> str:
    return "?" if v is None else str(v)


def summary_row(r: KernelResources) -> dict:
    """One flat row for tables and JSON (check, notebooks)."""
    occ = r.occupancy or {}
    isa = r.isa or {}
    if r.vendor == "amd":
        regs = f"v{_na(r.vgpr)} a{_na(r.agpr)} s{_na(r.sgpr)}"
        occupancy = (f"{occ['waves_per_eu']:g} waves/EU, {occ['workgroups_per_cu']} wg/CU ({occ['limited_by']})"
                     if occ else "?")
        spill = f"v{r.spills.get('vgpr', 0)} s{r.spills.get('sgpr', 0)}" if r.spills else "?"
    else:
        regs = _na(r.registers)
        occupancy = (f"{occ['blocks_per_sm']} blk/SM, {occ['warps_per_sm']} warps ({occ['limited_by']})"
                     if occ else "?")
        spill = f"st{r.spills['stores']} ld{r.spills['loads']}" if r.spills else "?"
    return {
        "kernel": r.display_name or r.name, "symbol": r.name, "target": r.target, "registers": regs,
        "shared": _fmt_bytes(r.shared_bytes), "scratch": _fmt_bytes(r.scratch_bytes), "spills": spill,
        "block": r.block, "occupancy": occupancy,
        "ld128": _na(isa.get("global_load_128")), "st128": _na(isa.get("global_store_128")),
        "matrix": _na(isa.get("matrix")), "lds_ops": _na(isa.get("lds")), "instructions": _na(isa.get("total")),
    }


COLUMNS = ("kernel", "target", "registers", "shared", "scratch", "spills", "block", "occupancy",
           "ld128", "st128", "matrix", "instructions")


def format_table(rows: list[dict], columns=COLUMNS, max_name: int = 60) -> str:
    """Plain-text table of summary rows."""
    def cell(row, c):
        text = str(row.get(c, ""))
        return text if c != "kernel" or len(text) <= max_name else text[:max_name - 3] + "..."
    widths = {c: max([len(c)] + [len(cell(r, c)) for r in rows]) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns), "  ".join("-" * widths[c] for c in columns)]
    lines += ["  ".join(cell(r, c).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


class Report:
    """Printable resources of one or more kernels (what `rocjit.inspect(...)` returns)."""

    def __init__(self, kernels: list[KernelResources]):
        self.kernels = kernels

    def __iter__(self):
        return iter(self.kernels)

    def __len__(self):
        return len(self.kernels)

    def __getitem__(self, i):
        return self.kernels[i]

    def rows(self) -> list[dict]:
        return [summary_row(k) for k in self.kernels]

    def __str__(self):
        text = format_table(self.rows())
        notes = sorted({n for k in self.kernels for n in k.notes})
        return text + "".join(f"\nnote: {n}" for n in notes)

    __repr__ = __str__


def inspect(obj, *, block: int | None = None, dynamic_shared: int = 0) -> Report:
    """Resources of a Kernel (its one kernel), or of every kernel in a CodeObject / Compiled / bytes."""
    if hasattr(obj, "code_object") and hasattr(obj, "mangled_name"):
        return Report(resources(obj.code_object, obj.mangled_name, block=block, dynamic_shared=dynamic_shared))
    return Report(resources(obj, block=block, dynamic_shared=dynamic_shared))


class _CallableModule(types.ModuleType):
    """`rocjit.inspect(k)` works whether the name holds this function or, after an explicit
    `import rocjit.inspect`, this module."""

    def __call__(self, obj, *, block=None, dynamic_shared=0):
        return inspect(obj, block=block, dynamic_shared=dynamic_shared)


sys.modules[__name__].__class__ = _CallableModule
