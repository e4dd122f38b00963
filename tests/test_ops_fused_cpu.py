"""CPU checks of the fused ops: every `// rocjit:check` instantiation compiles for sm_90a (and for the AMD
targets when the offline toolchain is installed), launch configurations, argument errors, lazy torch."""
import os
import re
import subprocess
import sys

import pytest

from rocjit.ops import _common as C

# every kernel file an op of the registry compiles (GEMV / skinny GEMM included)
FILES = __import__("rocjit.ops._op", fromlist=["kernel_sources"]).kernel_sources()


def _checks(name):
    from rocjit.compiler import kernels_src_dir
    text = (kernels_src_dir() / name).read_text()
    return re.findall(r"//\s*rocjit:check\s+(.+)", text)


def _nvrtc_available():
    try:
        from cuda.bindings import nvrtc  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.skipif(not _nvrtc_available(), reason="cuda-bindings (NVRTC) not installed")
@pytest.mark.parametrize("name", FILES)
def test_instantiations_compile_for_sm90a(name):
    names = _checks(name)
    assert names
    mod = C.module(name)
    for n in names:
        co = mod.compile("sm_90a", (n,))
        assert co.binary and n in co.lowered


def _require_amd(target):
    """Skip when no compiler can build `target` here, except where CI demands AMD builds (ROCJIT_REQUIRE_AMD=1)."""
    from rocjit import compilers, toolchain
    try:
        ready = compilers.amd_compiler_name(target) == "hiprtc" or toolchain.find() is not None
        why = "" if ready else "the offline AMD toolchain is not installed (python -m rocjit toolchain install)"
    except Exception as e:
        ready, why = False, f"{type(e).__name__}: {e}"
    if not ready:
        if os.environ.get("ROCJIT_REQUIRE_AMD") == "1":
            pytest.fail(f"ROCJIT_REQUIRE_AMD=1 but {target} cannot be built: {why}")
        pytest.skip(f"no AMD compiler for {target}: {why}")


@pytest.mark.parametrize("target", ["gfx90a", "gfx942", "gfx950"])
@pytest.mark.parametrize("name", FILES)
def test_instantiations_compile_for_amd(name, target):
    _require_amd(target)
    names = _checks(name)
    assert names
    mod = C.module(name)
    for n in names:
        co = mod.compile(target, (n,))
        assert co.binary and n in co.lowered


@pytest.mark.parametrize("chunks", [1, 3, 64, 512, 640, 832, 896, 2048])
@pytest.mark.parametrize("rows", [1, 31, 2048, 16384])
@pytest.mark.parametrize("wave", [32, 64])
def test_row_config_covers_the_row(chunks, rows, wave):
    for reduce in (True, False):
        threads, block, per_thread, tiles = C.row_config(chunks, rows, 132, wave, reduce=reduce)
        assert threads * per_thread * tiles >= chunks
        assert block % threads == 0 and block <= 1024
        assert threads <= wave or threads == block  # a row group is within a wave or the whole block
        assert (threads & (threads - 1)) == 0
        if reduce:
            assert tiles == 1


@pytest.mark.parametrize("chunks", [2048, 2049, 4096, 6656, 16384])
@pytest.mark.parametrize("rows", [1, 2, 8])
def test_split_config_covers_the_row(chunks, rows):
    split, threads, per_thread = C.split_config(chunks, rows, 132, 32)
    assert 2 <= split <= C.MAX_CLUSTER and threads % 32 == 0 and threads <= 1024
    per_block = -(-chunks // split)
    assert threads * per_thread >= per_block             # every block covers its share of the row
    assert threads * (per_thread - 1) < per_block        # ... with no more chunks per thread than that needs


@pytest.mark.parametrize(("chunks", "rows"), [(1, 1), (126, 1), (512, 8), (2047, 1), (2047, 8), (2048, 9),
                                              (4096, 9), (4096, 2048)])
def test_split_config_declines_short_or_many_rows(chunks, rows):
    """Below 2048 chunks (16K elements) or above 8 rows one block per row was measured faster: no split."""
    assert C.split_config(chunks, rows, 132, 32) is None


@pytest.mark.parametrize("chunks", [1, 7, 126, 513, 832, 2048])
@pytest.mark.parametrize("rows", [1, 2048])
@pytest.mark.parametrize("per_thread", [1, 2])
def test_tile_config_covers_the_row(chunks, rows, per_thread):
    threads, pt, tiles = C.tile_config(chunks, rows, 132, 32, per_thread=per_thread)
    assert threads % 32 == 0 and 32 <= threads <= 1024 and pt == per_thread
    assert threads * pt * tiles >= chunks
    assert threads * pt * (tiles - 1) < chunks  # no tile is entirely idle


def test_import_does_not_load_torch():
    code = "import sys, rocjit, rocjit.ops; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_errors_name_the_argument():
    torch = pytest.importorskip("torch")
    from rocjit import ops
    x = torch.randn(4, 64).half()
    with pytest.raises(TypeError, match="rms_norm: weight must have dtype float16, got bfloat16"):
        ops.rms_norm(x, torch.randn(64).bfloat16())
    with pytest.raises(TypeError, match="rms_norm: x must have dtype float16 or bfloat16, got float32"):
        ops.rms_norm(x.float(), torch.randn(64).half())
    with pytest.raises(ValueError, match="quant must be None, 'static' or 'per_token'"):
        ops.rms_norm(x, torch.randn(64).half(), quant="block")
    with pytest.raises(ValueError, match="swiglu: gate_up must be"):
        ops.swiglu(torch.randn(4, 63).half())
    with pytest.raises(ValueError, match="granularity must be"):
        ops.quantize_fp8(x, granularity="channel")
    with pytest.raises(ValueError, match="must be on a GPU"):
        ops.quantize_fp8(x)


def test_native_fp8_table():
    assert C.fp8_max("e4m3fn") == 448.0 and C.fp8_max("e4m3fnuz") == 240.0
    with pytest.raises(ValueError, match="fp8 format must be one of"):
        C.fp8_format("e5m2", None)


@pytest.mark.parametrize("wave,sms", [(32, 132), (64, 304), (64, 80)])
@pytest.mark.parametrize("B,hq,hkv,S,L,D", [(1, 32, 8, 1, 72, 128), (1, 32, 8, 1, 8192, 128), (8, 32, 8, 1, 1024, 128),
                                            (3, 28, 4, 1, 517, 128), (1, 64, 8, 4, 1000, 128), (2, 8, 1, 2, 300, 256),
                                            (1, 8, 2, 5, 61, 96), (64, 32, 8, 1, 100000, 64), (1, 4, 4, 1, 0, 8)])
def test_decode_attention_config_covers_every_key_and_row(B, hq, hkv, S, L, D, wave, sms):
    from rocjit.ops.attention import kernel_config
    k_rows, groups, warps, unroll, per_split, nsplit = kernel_config(B, hq, hkv, S, L, D, wave, sms)
    assert k_rows * groups >= (hq // hkv) * S and k_rows <= 4 and (k_rows * (groups - 1)) < (hq // hkv) * S
    assert per_split * nsplit >= L and per_split * (nsplit - 1) < max(L, 1)       # every key, no empty split
    assert warps * wave <= 1024 and warps * k_rows * D <= 8192                    # the kernel's static limits
    assert 1 <= unroll <= ((4 if k_rows <= 2 else 3) if wave == 32 else 2)       # registers (checked instantiations)
    assert nsplit == 1 or B * hkv * groups * nsplit <= max(sms, B * hkv * groups)  # at most one block per SM
