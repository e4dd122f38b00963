"""Skinny GEMM C = A W^T, M = 1..32: rocjit vs cuBLASLt FP8 (torch._scaled_mm, M padded to 16) and
cuBLAS bf16 (torch.matmul), in one run. Weights rotated beyond L2, CUDA-graph replays.
Shapes: the seed's decode projections (N, K) in {(2304, 16384), (13312, 16384), (16384, 6656)}.
mlp_gate_up_bf16: the gate/up projection of a bf16 model (2 x 6656 x 16384) with its SwiGLU: rocjit fused
(skinny_gemm_swiglu, one launch), rocjit op by op (skinny_gemm + swiglu) and torch.matmul + silu * up."""

from rocjit.bench import harness as H

SHAPES = ((2304, 16384), (13312, 16384), (16384, 6656))
ROWS = (1, 2, 4, 8, 16, 32)


def run(argv) -> dict:
    import torch
    from rocjit.ops.skinny import skinny_gemm
    quick = H.quick(argv)
    result = H.new_result("skinny", H.measure_ceilings(matmul=True, fp8=True))
    rows = (1, 16, 32) if quick else ROWS
    f8 = torch.float8_e4m3fn
    for N, K in SHAPES:
        for dt in (f8, torch.bfloat16):
            eb = 1 if dt == f8 else 2
            ws = [torch.randn(N, K, device="cuda").to(dt) for _ in range(H.rotation_count(N * K * eb))]
            sa = torch.tensor([0.5], device="cuda")
            sw = torch.rand(N, device="cuda") + 0.5
            sw1 = torch.tensor([0.7], device="cuda")
            for M in rows:
                a = torch.randn(M, K, device="cuda").to(dt)
                if dt == f8:
                    ours = H.time_rotating([lambda w=w: skinny_gemm(a, w, scale_a=sa, scale_w=sw) for w in ws], graph=True)
                    a16 = torch.zeros(max(16, -(-M // 16) * 16), K, device="cuda").to(f8)
                    a16[:M] = a
                    # cuBLASLt: per-tensor scales (its per-channel FP8 path needs rowwise scales for A as well)
                    peer = H.time_rotating([lambda w=w: torch._scaled_mm(a16, w.t(), sa, sw1, out_dtype=torch.bfloat16)
                                            for w in ws], graph=True)
                    peers = {"cublaslt_scaled_mm": peer}
                else:
                    ours = H.time_rotating([lambda w=w: skinny_gemm(a, w) for w in ws], graph=True)
                    peers = {"torch_matmul": H.time_rotating([lambda w=w: torch.matmul(a, w.t()) for w in ws], graph=True)}
                nbytes = N * K * eb + M * K * eb + M * N * 2
                H.add_row(result, "skinny_gemm", (M, N, K), str(dt).replace("torch.", ""), ours, peers,
                          H.floor_us(nbytes, result["ceilings"]), timing="graph")
                print(result["rows"][-1], flush=True)
            del ws
            torch.cuda.empty_cache()
    _mlp_bf16(result, rows)
    return result


def _mlp_bf16(result, rows):
    import torch
    import rocjit.ops as ops
    inter, K = 6656, 16384
    bf = torch.bfloat16
    n = H.rotation_count(2 * inter * K * 2)
    ws = [torch.randn(2 * inter, K, device="cuda").to(bf) for _ in range(n)]
    wis = [ops.prepare_gate_up(w[:inter], w[inter:])[0] for w in ws]

    def torch_mlp(a, w):
        g, u = (a @ w.t()).chunk(2, dim=-1)
        return torch.nn.functional.silu(g) * u

    for M in rows:
        a = torch.randn(M, K, device="cuda").to(bf)
        fused = H.time_rotating([lambda w=w: ops.skinny_gemm_swiglu(a, w) for w in wis], graph=True)
        peers = {"rocjit_op_by_op": H.time_rotating([lambda w=w: ops.swiglu(ops.skinny_gemm(a, w)) for w in ws],
                                                    graph=True),
                 "torch_matmul_silu": H.time_rotating([lambda w=w: torch_mlp(a, w) for w in ws], graph=True)}
        nbytes = 2 * inter * K * 2 + M * K * 2 + M * inter * 2
        H.add_row(result, "mlp_gate_up_bf16", (M, 2 * inter, K), "bfloat16", fused, peers,
                  H.floor_us(nbytes, result["ceilings"]), timing="graph")
        print(result["rows"][-1], flush=True)
    del ws, wis
    torch.cuda.empty_cache()
