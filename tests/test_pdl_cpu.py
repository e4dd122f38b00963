"""Programmatic dependent launch on a CPU: which sources opt in (`// rocjit:pdl`), that every kernel of such a source
waits for the grid ahead of it on sm_90+ (and carries no grid-dependency code before sm_90), which targets and
settings turn the launch attribute on, that the SASS loads nothing on the read-only path above the wait, and that the
native launcher's cuLaunchKernelEx call lays out the launch configuration as cuda.h does."""
import ctypes
import importlib
import re
import subprocess
import tempfile

import pytest

from rocjit import check, targets
from rocjit.kernel import Module

PDL_SOURCES = ("decode_attention.hip", "rms_norm.hip", "swiglu.hip", "quant_fp8.hip", "skinny_gemm.hip", "gemv.hip")


def _nvrtc():
    try:
        from cuda.bindings import nvrtc  # noqa: F401
        return True
    except ImportError:
        return False


def _entries(ptx: str) -> dict:
    """PTX text -> {entry name: body}."""
    parts = re.split(r"\.entry\s+(\w+)", ptx)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_the_library_sources_that_opt_in():
    opted = sorted(p.name for p in check.default_files() if Module(p.name).pdl)
    assert opted == sorted(PDL_SOURCES)


@pytest.mark.parametrize("filename", PDL_SOURCES)
def test_every_kernel_of_an_opted_in_source_waits_on_hopper(filename):
    if not _nvrtc():
        pytest.skip("cuda-bindings (NVRTC) not installed")
    mod = Module(filename)
    names = check.name_expressions(mod.source)
    assert names
    ptx = mod.compile("compute_90a", tuple(names)).binary.decode()
    entries = _entries(ptx)
    assert len(entries) == len(names)
    for entry, body in entries.items():
        assert "griddepcontrol.wait" in body, entry
        assert "griddepcontrol.launch_dependents" in body, entry
        # the wait comes before the entry's first global load and first global store
        wait = body.index("griddepcontrol.wait")
        for op in ("ld.global", "st.global", "cp.async.cg", "red.global", "atom.global"):
            if op in body:
                assert body.index(op) > wait, (entry, op)
    old = mod.compile("compute_89", tuple(names)).binary.decode()
    assert "griddepcontrol" not in old and "prefetch.global.L2" not in old


def _functions_sass(binary: bytes) -> dict:
    """{function section: [SASS lines]} of a cubin, by nvdisasm."""
    tool = importlib.import_module("rocjit.inspect")._nvidia_tool("nvdisasm")
    if tool is None:
        pytest.skip("nvdisasm not installed")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(binary)
        f.flush()
        text = subprocess.run([tool, "-c", f.name], capture_output=True, text=True, check=True).stdout
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            cur = out.setdefault(m.group(1), [])
        elif cur is not None:
            cur.append(line)
    return out


def _read_only_loads_before_the_wait(lines):
    wait = next((i for i, line in enumerate(lines) if "ACQBULK" in line), None)
    if wait is None:
        return ["no griddepcontrol.wait (ACQBULK) in the SASS"]
    return [line.strip() for line in lines[:wait] if "LDG" in line and ".CONSTANT" in line and ".NA" not in line]


@pytest.mark.parametrize("filename", PDL_SOURCES)
def test_no_read_only_load_is_scheduled_above_the_wait(filename):
    """The PTX order above is not the machine's: a load on the read-only path (ld.global.nc, SASS LDG...CONSTANT)
    promises its data cannot change during the kernel, so ptxas may schedule it above griddepcontrol.wait (SASS
    ACQBULK) -- a read of the kernel ahead's output before it is complete. The pipelined skinny build once did exactly
    that (transformers models decoded garbage while every isolated config test passed). Before the wait a kernel may
    read only what no kernel writes while it runs: the skinny GEMMs' weights, streamed with no-L1 loads (SASS .NA)."""
    if not _nvrtc():
        pytest.skip("cuda-bindings (NVRTC) not installed")
    mod = Module(filename)
    names = check.name_expressions(mod.source)
    co = mod.compile("sm_90a", tuple(names))
    sass = _functions_sass(co.binary)
    for n in names:
        assert not _read_only_loads_before_the_wait(sass[co.lowered[n]]), n


def test_the_directive_and_its_override():
    src = "__global__ void k(float* x) { x[0] = 1.0f; }\n"
    assert not Module(src).pdl
    assert Module("// rocjit:pdl\n" + src).pdl
    assert not Module("// rocjit:pdl\n" + src, pdl=False).pdl
    assert Module(src, pdl=True).pdl
    assert not Module("// rocjit:pdl is not this line\n" + src).pdl


def test_which_targets_and_settings_launch_with_the_attribute(monkeypatch):
    assert targets.has_programmatic_launch("sm_90a") and targets.has_programmatic_launch("sm_100")
    assert not targets.has_programmatic_launch("sm_89") and not targets.has_programmatic_launch("sm_80")
    assert not targets.has_programmatic_launch("gfx942") and not targets.has_programmatic_launch("gfx950")
    k = Module("// rocjit:pdl\n__global__ void k(float* x) { x[0] = 1.0f; }\n")["k"]
    plain = Module("__global__ void k(float* x) { x[0] = 1.0f; }\n")["k"]
    monkeypatch.delenv("ROCJIT_PDL", raising=False)
    assert k.programmatic_launch("sm_90a") and not k.programmatic_launch("sm_89")
    assert not k.programmatic_launch("gfx942") and not plain.programmatic_launch("sm_90a")
    monkeypatch.setenv("ROCJIT_PDL", "0")
    assert not k.programmatic_launch("sm_90a")


class _Attr(ctypes.Structure):          # CUlaunchAttribute as cuda.h 12.x declares it
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class _Config(ctypes.Structure):        # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("numAttrs", ctypes.c_uint)]


def test_the_native_pdl_launch_fills_cuda_s_launch_config():
    from rocjit import native
    mod = native.module()
    if mod is None:
        pytest.skip(f"native launcher: {native.status()}")
    seen = {}
    EX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)

    def fake_launch_ex(cfg, f, params, extra):
        c = cfg.contents
        seen.update(grid=(c.gridDimX, c.gridDimY, c.gridDimZ), block=(c.blockDimX, c.blockDimY, c.blockDimZ),
                    shared=c.sharedMemBytes, stream=c.hStream, n=c.numAttrs, f=f, params=params, extra=extra,
                    attr=(c.attrs[0].id, int.from_bytes(c.attrs[0].value[:4], "little")))
        return 7
    ex = EX(fake_launch_ex)
    addr = mod.pdl_launch(ctypes.cast(ex, ctypes.c_void_p).value)
    LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_void_p)
    err = LAUNCH(addr)(0x1000, 3, 2, 1, 128, 1, 1, 4096, 0x2000, 0x3000, None)
    assert err == 7      # the driver's answer comes back unchanged
    assert seen == {"grid": (3, 2, 1), "block": (128, 1, 1), "shared": 4096, "stream": 0x2000, "n": 1,
                    "f": 0x1000, "params": 0x3000, "extra": None, "attr": (6, 1)}


@pytest.mark.parametrize("kernel, rows_of, builds", [
    ("skinny_tma_kernel", lambda args: int(args[2]), {8, 16, 32}),     # NB: activation rows
    ("skinny_stream_kernel", lambda args: 8 * int(args[3]), None),     # NT: activation tiles of 8 rows
])
def test_whole_sm_skinny_kernels_let_the_next_kernel_in_early_only_above_16_rows(kernel, rows_of, builds):
    """The kernels whose blocks hold a whole SM let the next kernel in once their copies are issued only above 16
    activation rows (copies_issued_launch_dependents); otherwise the block does so only as it ends (a grid of many
    small blocks let in early lands on the SMs in the order these blocks leave them). In PTX: two launch_dependents
    (the copy side's, the end's) against one."""
    if not _nvrtc():
        pytest.skip("cuda-bindings (NVRTC) not installed")
    mod = Module("skinny_gemm.hip")
    names = [n for n in check.name_expressions(mod.source) if n.startswith(kernel + "<")]
    rows = {n: rows_of(n.split(",")) for n in names}
    assert {r > 16 for r in rows.values()} == {True, False}
    if builds is not None:
        assert set(rows.values()) == builds
    co = mod.compile("compute_90a", tuple(names))
    entries = _entries(co.binary.decode())
    for n, r in rows.items():
        body = entries[co.lowered[n]]
        assert body.count("griddepcontrol.launch_dependents") == (2 if r > 16 else 1), n
