"""FP8 quantization of [rows, 7168] bf16: 1x128 blockwise (rows 1..16384), per-token, dynamic per-tensor, the
dual row+col quantization against two separate (row-only, column-only) launches and torch.compile, and the two
calls of the FP8 training layer (dual with the column blocks transposed, 128 x 128 weight tiles with the transposed
copy) against torch.compile."""

from rocjit.bench import harness as H


def ref_block(x):
    import torch
    M, K = x.shape
    xb = x.float().view(M, K // 128, 128)
    s = xb.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448.0
    return (xb / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(M, K), s.squeeze(-1)


def ref_col(x):
    import torch
    M, K = x.shape
    xb = x.float().view(M // 128, 128, K)
    s = xb.abs().amax(1, keepdim=True).clamp_min(1e-12) / 448.0
    return (xb / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(M, K), s.squeeze(1)


def ref_dual(x):
    return ref_block(x) + ref_col(x)


def ref_dual_t(x):
    """The dual quantization with the column blocks stored transposed (FP8Linear's layout: q_col [K, M])."""
    q_row, s_row, q_col, s_col = ref_dual(x)
    return q_row, s_row, q_col.t().contiguous(), s_col


def ref_weight_t(x):
    """128 x 128 tiles and the transposed copy of the quantized weight (quantize_fp8_weight(transposed=True))."""
    import torch
    M, K = x.shape
    xb = x.float().view(M // 128, 128, K // 128, 128)
    s = xb.abs().amax((1, 3), keepdim=True).clamp_min(1e-12) / 448.0
    q = (xb / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(M, K)
    return q, s.view(M // 128, K // 128), q.t().contiguous()


def ref_token(x):
    import torch
    s = x.float().abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448.0
    return (x.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), s


def run(argv) -> dict:
    import torch
    import rocjit.ops as ops
    from rocjit.ops import quant as Q
    torch._dynamo.config.cache_size_limit = 256
    quick = H.quick(argv)
    result = H.new_result("quant", H.measure_ceilings(matmul=False))
    cb, ct, cd = (torch.compile(f, dynamic=False) for f in (ref_block, ref_token, ref_dual))
    K = 7168
    rows_list = [1, 4, 16, 64, 256, 1024, 4096, 16384] if not quick else [1, 256, 16384]

    def bench(case, rows, ours, peers, nbytes, per_set):
        n = H.rotation_count(per_set)
        sets = [torch.randn(rows, K, device="cuda").to(torch.bfloat16) for _ in range(n)]
        graph = True  # device time; eager Python overhead (tens of µs) would hide the kernel for mid sizes
        t = lambda f: H.time_rotating([lambda x=x: f(x) for x in sets], graph=graph)  # noqa: E731
        H.add_row(result, case, (rows, K), "bfloat16", t(ours), {k: t(f) for k, f in peers.items()},
                  H.floor_us(nbytes, result["ceilings"]), timing="graph" if graph else "events")
        print(result["rows"][-1], flush=True)

    for rows in rows_list:
        nb = rows * K * 3 + rows * (K // 128) * 4
        bench("block_1x128", rows, lambda x: ops.quantize_fp8(x, granularity="block"),
              {"torch_compile": cb, "torch_eager": ref_block}, nb, nb)
    for rows in ([16, 4096] if not quick else [4096]):
        nb = rows * K * 3 + rows * 4
        bench("per_token", rows, lambda x: ops.quantize_fp8(x, granularity="token"),
              {"torch_compile": ct, "torch_eager": ref_token}, nb, nb)
        bench("per_tensor_dynamic", rows, lambda x: ops.quantize_fp8(x), {}, rows * K * 5, nb)
    for rows in ([4096, 16384] if not quick else [16384]):
        nb = rows * K * 4 + rows * (K // 128) * 4 + (rows // 128) * K * 4
        separate = lambda x: (Q._dual(x, "e4m3fn", 1), Q._dual(x, "e4m3fn", 2))  # noqa: E731
        bench("dual_row_col", rows, lambda x: ops.quantize_fp8_dual(x),
              {"separate_row_col_rocjit": separate, "torch_compile": cd}, nb, nb)
    # the training layer's calls (rocjit.nn.FP8Linear): the dual quantization with its column blocks transposed (the
    # wgrad operand) and the weight's tiles with the transposed copy (the dgrad operand)
    cdt, cwt = (torch.compile(f, dynamic=False) for f in (ref_dual_t, ref_weight_t))
    for rows in ([4096, 16384] if not quick else [16384]):
        nb = rows * K * 4 + rows * (K // 128) * 4 + (rows // 128) * K * 4
        bench("dual_row_col_transposed", rows, lambda x: ops.quantize_fp8_dual(x, transpose_col=True),
              {"torch_compile": cdt}, nb, nb)
        nb = rows * K * 4 + (rows // 128) * (K // 128) * 4
        bench("weight_tiles_transposed", rows, lambda x: ops.quantize_fp8_weight(x, transposed=True),
              {"torch_compile": cwt}, nb, nb)
    return result
