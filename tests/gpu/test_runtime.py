"""The runtime on a real GPU: frameworks, templates, shared memory, streams, graphs, devices, errors."""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import rocjit

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU visible to torch", allow_module_level=True)

AXPY = r"""
#include <hip/hip_runtime.h>
__global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""

SCALE_T = r"""
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
template <typename T, int VEC>
__global__ void scale(const T* __restrict__ x, T* __restrict__ y, float s, int n) {
  int i = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  #pragma unroll
  for (int v = 0; v < VEC; ++v)
    if (i + v < n) y[i + v] = T(float(x[i + v]) * s);
}
"""

BIG_SHARED = r"""
#include <hip/hip_runtime.h>
__global__ void reverse_block(const float* x, float* y, int n) {
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = x[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = buf[n - 1 - i];
}
"""


def _blocks(n, t=256):
    return (n + t - 1) // t


@pytest.fixture(scope="module")
def axpy():
    return rocjit.kernel(AXPY)


def test_axpy_torch(axpy):
    n = 100_003
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    ref = 2.5 * x.double() + y.double()
    axpy[_blocks(n), 256](2.5, x, y, n)
    torch.cuda.synchronize()
    torch.testing.assert_close(y.double(), ref, rtol=1e-6, atol=1e-6)


def test_axpy_numpy_staged_and_in_out(axpy):
    n = 4097
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    ref = -1.5 * x.astype(np.float64) + y        # the GPU fuses a*x+y: compare to float64 with fp32 tolerance
    axpy[_blocks(n), 256](-1.5, x, y, n)           # y is copied in and back
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    y2 = rng.standard_normal(n).astype(np.float32)
    ref2 = x.astype(np.float64) + y2
    axpy[_blocks(n), 256](1.0, rocjit.In(x), rocjit.InOut(y2), n)
    np.testing.assert_allclose(y2, ref2, rtol=1e-6, atol=1e-6)
    ro = y.copy()
    ro.flags.writeable = False
    before = ro.copy()
    axpy[_blocks(n), 256](3.0, x, ro, n)          # read-only arrays are never written back
    np.testing.assert_array_equal(ro, before)
    # Out: not copied in, copied back; a strided (non-contiguous) destination is filled element by element
    scale = rocjit.Module(SCALE_T)["scale<float, 1>"]
    out = np.full((n, 2), np.nan, np.float32)
    scale[_blocks(n), 256](rocjit.In(x), rocjit.Out(out[:, 1]), 2.0, n)
    np.testing.assert_allclose(out[:, 1], 2.0 * x, rtol=1e-6)
    assert np.isnan(out[:, 0]).all()


def test_axpy_cupy(axpy):
    cupy = pytest.importorskip("cupy")
    n = 5000
    x = cupy.random.standard_normal(n, dtype=cupy.float32)
    y = cupy.random.standard_normal(n, dtype=cupy.float32)
    ref = 0.5 * x.astype(cupy.float64) + y.astype(cupy.float64)
    axpy[_blocks(n), 256](0.5, x, y, n)
    cupy.cuda.Device().synchronize()
    assert float(cupy.abs(y - ref).max()) < 1e-5


def test_axpy_jax_dlpack():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("jax sees no GPU")
    scale = rocjit.Module(SCALE_T)["scale<float, 1>"]
    n = 3001
    xh = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    x = jax.device_put(jnp.asarray(xh), gpus[0])
    out = jax.device_put(jnp.full((n,), jnp.nan, jnp.float32), gpus[0])
    x.block_until_ready()
    out.block_until_ready()
    scale[_blocks(n), 256](x, out, 2.0, n)   # reads and writes jax buffers through DLPack
    torch.cuda.synchronize()
    np.testing.assert_allclose(np.asarray(out), 2 * xh, rtol=1e-6)


@pytest.mark.parametrize("dtype,ctype", [(torch.float16, "__half"), (torch.float32, "float")])
def test_template_name_expression(dtype, ctype):
    mod = rocjit.Module(SCALE_T)
    k = mod[f"scale<{ctype}, 4>"]
    n = 1021
    x = torch.randn(n, device="cuda", dtype=dtype)
    y = torch.full((n,), float("nan"), device="cuda", dtype=dtype)
    k[_blocks(n, 128 * 4), 128](x, y, 0.75, n)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, (x.float() * 0.75).to(dtype))


def test_dynamic_shared_above_48k():
    k = rocjit.kernel(BIG_SHARED)
    n = 24_000                                   # 96 000 bytes of shared memory
    x = torch.randn(n, device="cuda")
    y = torch.full_like(x, float("nan"))
    k[1, 1024](x, y, n, shared_mem=n * 4)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x.flip(0))
    with pytest.raises(ValueError, match="exceeds the device's limit"):
        k[1, 1024](x, y, n, shared_mem=10 ** 7)


def test_streams_current_and_explicit(axpy):
    n = 1 << 20
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    ref = x + y
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        axpy[_blocks(n), 256](1.0, x, y, n)   # runs on s, the current stream
    s.synchronize()
    torch.testing.assert_close(y, ref)
    y2 = torch.randn(n, device="cuda")
    ref2 = 2 * x + y2
    s2 = torch.cuda.Stream()
    s2.wait_stream(torch.cuda.current_stream())
    axpy[_blocks(n), 256](2.0, x, y2, n, stream=s2)          # a torch stream object
    s2.synchronize()
    torch.testing.assert_close(y2, ref2)
    y3 = torch.randn(n, device="cuda")
    ref3 = 3 * x + y3
    torch.cuda.synchronize()
    axpy[_blocks(n), 256](3.0, x, y3, n, stream=s2.cuda_stream)  # a raw handle
    s2.synchronize()
    torch.testing.assert_close(y3, ref3)


def test_native_launcher_takes_the_common_launches(axpy):
    """Tensors, Python scalars, current / explicit streams, parameters, other threads: launched from C, correctly."""
    from rocjit import native
    if os.environ.get("ROCJIT_NATIVE_LAUNCH") == "0":
        pytest.skip("native launcher turned off")
    assert native.module() is not None, native.status()
    n = 4099
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    axpy[_blocks(n), 256](0.0, x, y, n)
    launch = axpy[_blocks(n), 256]
    assert type(launch).__name__ == "Launcher", "no native launcher for a torch-tensor launch"
    before = launch.native_calls
    ref = 2 * x + y
    launch(2.0, x, y, n)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        launch(1.0, torch.nn.Parameter(x), y, n)            # the current stream; a Parameter is a tensor
    launch(-1, x, y, n, stream=s.cuda_stream)              # an int handle; an int for a float parameter
    s.synchronize()
    torch.testing.assert_close(y, ref)
    assert launch.native_calls == before + 3

    def in_thread(out):        # a new thread: the first launch sets the context up, the next ones are native
        for _ in range(3):
            launch(1.0, x, out, n)
        torch.cuda.synchronize()
    y2 = torch.zeros(n, device="cuda")
    t = threading.Thread(target=in_thread, args=(y2,))
    t.start()
    t.join()
    torch.testing.assert_close(y2, 3 * x)
    assert launch.native_calls >= before + 5


def test_graph_capture_replays_on_new_data(axpy):
    n = 8192
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    axpy[_blocks(n), 256](1.0, x, y, n)       # warm-up outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        axpy[_blocks(n), 256](2.0, x, y, n)
    for _ in range(3):
        x.copy_(torch.randn(n, device="cuda"))
        y.copy_(torch.randn(n, device="cuda"))
        ref = 2 * x + y
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, ref)


def test_two_devices():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    k = rocjit.kernel(AXPY)
    n = 1000
    torch.cuda.set_device(0)
    x1 = torch.randn(n, device="cuda:1")
    y1 = torch.randn(n, device="cuda:1")
    ref = x1 + y1
    k[_blocks(n), 256](1.0, x1, y1, n)                  # first call: compile, load on device 1, general path
    torch.cuda.synchronize(1)
    torch.testing.assert_close(y1, ref)
    assert torch.cuda.current_device() == 0             # the caller's current device is left alone
    for _ in range(3):                                  # the generated launcher, both devices in turn
        for d in (0, 1):
            x = torch.randn(n, device=f"cuda:{d}")
            y = torch.randn(n, device=f"cuda:{d}")
            ref = 3 * x + y
            k[_blocks(n), 256](3.0, x, y, n)
            torch.cuda.synchronize(d)
            torch.testing.assert_close(y, ref)
            assert torch.cuda.current_device() == 0
            assert torch.empty(1, device="cuda").device.index == 0
    x0 = torch.randn(n, device="cuda:0")
    with pytest.raises(rocjit.ArgumentError, match="different devices"):
        k[_blocks(n), 256](1.0, x0, y1, n)


# ----------------------------------------------------------------------------- errors
def test_errors_name_the_parameter(axpy):
    n = 16
    x = torch.randn(n, device="cuda")
    with pytest.raises(rocjit.ArgumentError, match=r"takes 4 arguments \(a, x, y, n\), got 3"):
        axpy[1, 32](1.0, x, n)
    with pytest.raises(rocjit.ArgumentError, match="'x'.*expected element dtype float32, got float16"):
        axpy[1, 32](1.0, x.half(), x, n)
    with pytest.raises(rocjit.ArgumentError, match="'y'.*host \\(CPU\\) memory"):
        axpy[1, 32](1.0, x, x.cpu(), n)
    with pytest.raises(rocjit.ArgumentError, match="'n'.*expected an int, got float"):
        axpy[1, 32](1.0, x, x, 2.5)
    with pytest.raises(rocjit.ArgumentError, match="'a'.*expected a float"):
        axpy[1, 32]("2", x, x, n)
    with pytest.raises(rocjit.ArgumentError, match="'x'.*not contiguous"):
        z = torch.randn(n, 2, device="cuda")
        axpy[1, 32](1.0, z[:, 0], x, n)
    with pytest.raises(rocjit.ArgumentError, match="'x'.*expected a GPU array"):
        axpy[1, 32](1.0, [1.0, 2.0], x, n)
    with pytest.raises(rocjit.ArgumentError, match="'n'.*does not fit"):
        axpy[1, 32](1.0, x, x, 2 ** 40)
    host = np.zeros(4, np.float32)
    with pytest.raises(rocjit.ArgumentError, match="not a device pointer"):
        axpy[1, 32](1.0, host.ctypes.data, x, n)


def test_pointee_type_checks():
    k = rocjit.Module(SCALE_T)["scale<__half, 1>"]
    x = torch.randn(8, device="cuda")
    with pytest.raises(rocjit.ArgumentError, match="expected element dtype float16, got float32"):
        k[1, 32](x, x, 1.0, 8)


def test_launch_error_has_vendor_name(axpy):
    x = torch.randn(16, device="cuda")
    with pytest.raises(ValueError, match="at most 1024"):
        axpy[1, 2048](1.0, x, x, 16)
    with pytest.raises(rocjit.LaunchError, match="CUDA_ERROR_INVALID_VALUE"):
        axpy[(1, 1, 1 << 20), 32](1.0, x, x, 16)


def test_compile_error_shows_source():
    bad = "#include <hip/hip_runtime.h>\n__global__ void broken(float* x) {\n  x[0] = undefined_name;\n}\n"
    with pytest.raises(rocjit.CompileError) as ei:
        rocjit.kernel(bad)[1, 1](torch.zeros(1, device="cuda"))
    msg = str(ei.value)
    assert "undefined_name" in msg and ">>    3 |" in msg


def test_debug_mode_catches_fault(tmp_path):
    """ROCJIT_DEBUG=1 synchronises after each launch and raises LaunchError at the faulting launch."""
    code = textwrap.dedent(r'''
        import torch, rocjit
        k = rocjit.kernel(r"""
        #include <hip/hip_runtime.h>
        __global__ void oob(float* x, long long off) { x[off] = 1.0f; }
        """)
        x = torch.zeros(4, device="cuda")
        try:
            k[1, 1](x, 1 << 40)
        except rocjit.LaunchError as e:
            print("LAUNCH_ERROR", e.error_name)
        ''')
    env = dict(os.environ, ROCJIT_DEBUG="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "LAUNCH_ERROR CUDA_ERROR_ILLEGAL_ADDRESS" in out.stdout, out.stdout + out.stderr


def test_cache_hit_in_new_process(tmp_path):
    code = (
        "import torch, rocjit\n"
        f"k = rocjit.kernel({AXPY!r})\n"
        "x = torch.ones(8, device='cuda'); y = torch.ones(8, device='cuda')\n"
        "k[1, 32](1.0, x, y, 8); torch.cuda.synchronize(); assert y.sum().item() == 16\n"
        "print(rocjit.cache.info()['hits'], rocjit.cache.info()['misses'])\n")
    env = dict(os.environ, ROCJIT_CACHE_DIR=str(tmp_path))
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert first.stdout.split() == ["0", "1"], first.stderr
    assert second.stdout.split() == ["1", "1"], second.stderr


def test_inspect_live_kernel(axpy):
    x = torch.randn(8, device="cuda")
    axpy[1, 32](1.0, x, x, 8)
    report = rocjit.inspect(axpy)
    assert "axpy" in str(report)


def test_example_clean_under_compute_sanitizer(tmp_path):
    import shutil
    tool = shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer",) if os.path.exists(p)), None)
    if tool is None:
        pytest.skip("compute-sanitizer not installed")
    script = tmp_path / "example.py"
    script.write_text(
        "import torch, rocjit\n"
        f"k = rocjit.kernel({AXPY!r})\n"
        "n = 10007\n"
        "x = torch.randn(n, device='cuda'); y = torch.randn(n, device='cuda'); ref = 3 * x + y\n"
        "k[(n + 255) // 256, 256](3.0, x, y, n)\n"
        "torch.cuda.synchronize(); assert torch.allclose(y, ref, atol=1e-5)\n"
        "print('example ok')\n")
    out = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "9", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "example ok" in out.stdout and "ERROR SUMMARY: 0 errors" in out.stdout
