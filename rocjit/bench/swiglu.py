"""SwiGLU + FP8 (static scale), rows x 2*6656 fp16: rocjit vs torch eager vs torch.compile."""

from rocjit.bench import harness as H


def reference(gu, s):
    import torch
    d = gu.shape[-1] // 2
    g, u = gu[..., :d].float(), gu[..., d:].float()
    return (torch.nn.functional.silu(g) * u / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def run(argv) -> dict:
    import torch
    import rocjit.ops as ops
    torch._dynamo.config.cache_size_limit = 256
    quick = H.quick(argv)
    result = H.new_result("swiglu", H.measure_ceilings(matmul=False))
    compiled = torch.compile(reference, dynamic=False)
    d = 6656
    rows_list = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048] if not quick else [1, 32, 2048]
    for rows in rows_list:
        per_set = rows * 2 * d * 2 + rows * d
        n = H.rotation_count(per_set)
        sets = [torch.randn(rows, 2 * d, device="cuda").to(torch.float16) for _ in range(n)]
        s = torch.tensor([0.05], device="cuda")
        graph = True  # device time; eager Python overhead (tens of µs) would hide the kernel for mid sizes
        ours = H.time_rotating([lambda x=x: ops.swiglu(x, scale=s) for x in sets], graph=graph)
        peers = {"torch_compile": H.time_rotating([lambda x=x: compiled(x, s) for x in sets], graph=graph),
                 "torch_eager": H.time_rotating([lambda x=x: reference(x, s) for x in sets], graph=graph)}
        H.add_row(result, "swiglu_fp8", (rows, 2 * d), "float16", ours, peers, H.floor_us(per_set, result["ceilings"]),
                  timing="graph" if graph else "events")
        print(result["rows"][-1], flush=True)
    return result
