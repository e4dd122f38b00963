"""CPU checks of the fused ops: every `// rocjit:check` instantiation compiles for sm_90a (and for the AMD
targets when the offline toolchain is installed), launch configurations, argument errors, lazy torch."""
import re
import subprocess
import sys

import pytest

from rocjit.ops import _common as C

FILES = ["rms_norm.hip", "swiglu.hip", "quant_fp8.hip"]


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


def _amd_ready(target):
    try:
        from rocjit import toolchain
        return toolchain.find() is not None
    except Exception:
        return False


@pytest.mark.parametrize("target", ["gfx90a", "gfx942", "gfx950"])
@pytest.mark.parametrize("name", FILES)
def test_instantiations_compile_for_amd(name, target):
    if not _amd_ready(target):
        pytest.skip(f"no offline AMD toolchain for {target} (python -m rocjit toolchain install)")
    mod = C.module(name)
    for n in _checks(name):
        assert mod.compile(target, (n,)).binary


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


@pytest.mark.parametrize("chunks", [1, 126, 512, 2048, 2049, 4096])
@pytest.mark.parametrize("rows", [1, 8, 9, 2048])
def test_split_config_covers_the_row(chunks, rows):
    cfg = C.split_config(chunks, rows, 132, 32)
    if cfg is None:
        return
    split, threads, per_thread = cfg
    assert 2 <= split <= C.MAX_CLUSTER and threads % 32 == 0 and threads <= 1024
    assert split * threads * per_thread >= chunks


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
