"""add + RMSNorm + FP8 (static scale): rocjit vs torch eager vs torch.compile of the same function.
Shapes: rows 1..2048 x 16384 fp16 (the seed's table), rows x 4096 / 8192 bf16."""

from rocjit.bench import harness as H


def reference(x, r, w, s, eps: float = 1e-6):
    import torch
    h = x + r
    r.copy_(h)
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * w.float()
    return (y / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def run(argv) -> dict:
    import torch
    import rocjit.ops as ops
    torch._dynamo.config.cache_size_limit = 256
    quick = H.quick(argv)
    result = H.new_result("norm", H.measure_ceilings(matmul=False))
    compiled = torch.compile(reference, dynamic=False)
    rows_16k = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    rows_small = [1, 32, 256, 2048]
    if quick:
        rows_16k, rows_small = [1, 32, 2048], [2048]
    cases = [(16384, torch.float16, r) for r in rows_16k] + [(h, torch.bfloat16, r) for h in (4096, 8192)
                                                             for r in rows_small]
    for hidden, dtype, rows in cases:
        per_set = rows * hidden * (2 + 2 + 2 + 1) + hidden * 2
        n = H.rotation_count(per_set)
        sets = [(torch.randn(rows, hidden, device="cuda").to(dtype), torch.randn(rows, hidden, device="cuda").to(dtype))
                for _ in range(n)]
        w = torch.randn(hidden, device="cuda").to(dtype)
        s = torch.tensor([0.05], device="cuda")
        graph = True  # device time; eager Python overhead (tens of µs) would hide the kernel for mid sizes
        ours = H.time_rotating([lambda x=x, r=r: ops.rms_norm(x, w, residual=r, scale=s) for x, r in sets], graph=graph)
        peers = {"torch_compile": H.time_rotating([lambda x=x, r=r: compiled(x, r, w, s) for x, r in sets], graph=graph),
                 "torch_eager": H.time_rotating([lambda x=x, r=r: reference(x, r, w, s) for x, r in sets], graph=graph)}
        H.add_row(result, "add_rmsnorm_fp8", (rows, hidden), str(dtype).replace("torch.", ""), ours, peers,
                  H.floor_us(per_set, result["ceilings"]), timing="graph" if graph else "events")
        print(result["rows"][-1], flush=True)
    _host_row(result, compiled, ops)
    return result


def host_us(fn, *, calls: int = 2000, repeats: int = 7) -> float:
    """Median host µs per call of fn() issued back to back (the device keeps up: one small row)."""
    import statistics
    import time
    import torch
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def _host_row(result, compiled, ops):
    """Eager host cost per call at [1, 16384] fp16 (what a decode step pays outside CUDA graphs)."""
    import torch
    x, r = torch.randn(1, 16384, device="cuda").half(), torch.randn(1, 16384, device="cuda").half()
    w, s = torch.randn(16384, device="cuda").half(), torch.tensor([0.05], device="cuda")
    ours = host_us(lambda: ops.rms_norm(x, w, residual=r, scale=s))
    peers = {"torch_compile": host_us(lambda: compiled(x, r, w, s)), "torch_eager": host_us(lambda: reference(x, r, w, s))}
    H.add_row(result, "eager_host_us_per_call", (1, 16384), "float16", ours, peers, None, timing="host")
    print(result["rows"][-1], flush=True)
