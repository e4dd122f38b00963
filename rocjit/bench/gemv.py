"""GEMV y = W x, square n = 512 ... 16384: rocjit fp16 / int8 / int4 vs torch.mv fp16 (cuBLAS) in one run.
Weights rotated beyond L2, CUDA-graph replays. int4: group 128, fp16 scales and zero points."""

from rocjit.bench import harness as H

SIZES = (512, 1024, 2048, 4096, 8192, 16384)


def run(argv) -> dict:
    import torch
    from rocjit.ops import int_quant as Q
    from rocjit.ops import gemv
    quick = H.quick(argv)
    result = H.new_result("gemv", H.measure_ceilings(matmul=False))
    sizes = (2048, 16384) if quick else SIZES
    for n in sizes:
        x = torch.randn(n, device="cuda").half()
        fw = [torch.randn(n, n, device="cuda").half() for _ in range(H.rotation_count(2 * n * n))]
        mv = H.time_rotating([lambda w=w: torch.mv(w, x) for w in fw], graph=True)
        ours = H.time_rotating([lambda w=w: gemv(w, x) for w in fw], graph=True)
        H.add_row(result, "gemv_fp16", (n, n), "float16", ours, {"torch_mv_fp16": mv},
                  H.floor_us(2 * n * n + 4 * n, result["ceilings"]), timing="graph")
        print(result["rows"][-1], flush=True)
        base = fw[0].float()
        del fw
        q, s = Q.quantize_int8(base)
        nb = n * n + 4 * n + 4 * n
        sets = [(q, s)] + [(q.clone(), s.clone()) for _ in range(H.rotation_count(nb) - 1)]
        ours = H.time_rotating([lambda q=q, s=s: gemv(q, x, w_scale=s) for q, s in sets], graph=True)
        H.add_row(result, "gemv_int8", (n, n), "int8", ours, {"torch_mv_fp16": mv}, H.floor_us(nb, result["ceilings"]),
                  timing="graph")
        print(result["rows"][-1], flush=True)
        p, s4, z4 = Q.quantize_int4(base, 128)
        nb = n * n // 2 + 2 * 2 * n * n // 128 + 4 * n
        sets = [(p, s4, z4)] + [(p.clone(), s4.clone(), z4.clone()) for _ in range(H.rotation_count(nb) - 1)]
        ours = H.time_rotating([lambda p=p, s=s, z=z: gemv(p, x, w_scale=s, w_zero=z, group_size=128)
                                for p, s, z in sets], graph=True)
        H.add_row(result, "gemv_int4_g128", (n, n), "int4", ours, {"torch_mv_fp16": mv},
                  H.floor_us(nb, result["ceilings"]), timing="graph")
        print(result["rows"][-1], flush=True)
        del sets, base
        torch.cuda.empty_cache()
    return result
