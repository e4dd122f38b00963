"""Blockwise-scaled FP8 GEMM (1 x 128 activation scales, 128 x 128 weight scales): rocjit.ops.gemm_fp8_blockwise
per layout (NT forward, NN dgrad, TN wgrad) vs cuBLASLt blockwise (torch.nn.functional.scaled_mm with
ScalingType.BlockWise1x128 / BlockWise128x128; reported absent where this torch lacks it) and bf16 torch.matmul,
in one run. TFLOP/s and % of the dense FP8 peak (tensorwise torch._scaled_mm at 8192^3, measured in the same run).
cuBLASLt computes the blockwise product only with K-major operands, so its timing is the peer of every layout of a
shape (each of our layouts gets its operands K-major from the quantizers, as the FP8 Linear does); TN (wgrad) also
has cuBLASLt's peer for its own recipe, 1 x 128 scales on both operands (cublaslt_blockwise_1x128_1x128), its
operands quantized as FP8Linear's backward quantizes them.
Plus the training-step rows: forward + backward of an MLP block (Linear, GELU, Linear), rocjit.nn.FP8Linear (with
torch's GELU between) and rocjit.nn.FP8MLP (the GELU fused into the quantizers) vs bf16 torch.nn.Linear, and the
same three blocks' forward without grad mode (mlp_inference_fwd rows: the layers then skip the copies only the
backward reads). Every product is timed as CUDA-graph replays, so the rows are GPU time: events around eager calls
timed the op's Python launch path wherever it outlasted the kernel (an H200 host that launched slowly read the op at
147 us for a 116 us kernel at 4096^3). Shapes > 256 rows are timed in rounds that take every implementation of the
shape in turn (the order reversed every other round; each one's median over the rounds): timed one after the other,
the later ones ran on a hotter, lower-clocked GPU (H100, 8192^3: the same NT call 1221 -> 1046 TFLOP/s over four
consecutive timings, and NN, the same kernel timed right after NT, 7 - 12% slower than NT in single-pass runs). The
compared implementations -- each layout of the op beside its peer -- take ROUNDS rounds among themselves; the
per-config diagnostic rows below take their own rounds afterwards. Timed in one set of rounds with them, the peer of
TN sat right after a dozen diagnostic kernels (some at a third of the op's rate, drawing less power) in two rounds
of three, and TN read 0.79 - 0.88x of it where the same pair, timed alone in alternation, read 0.90 - 1.01x, and
0.89 - 0.97x with the GPU idle before every timing (H200, four shapes, one run). An implementation that cannot be
captured is timed with events, and a note says so. Products of <= 256 rows run over copies of the weight beyond L2
(_weight_sets), as the skinny GEMMs are measured.
The host_cost row is the host's side: µs per repeated eager call (no synchronize inside the loop, the GPU work short
enough that the launch queue never fills) of the op, cuBLASLt blockwise and bf16 torch.matmul at 128 x 2112 x 7168.
On sm_90a, every config of the wgmma kernel (gemm_fp8_blockwise_sm90.hip) is also launched directly for the NT
products of >= 128 rows, its output compared with the op's, as rows gemm_fp8_blockwise_NT_wgmma_<config> (the op
offers these configs to its tuner there unless ROCJIT_GEMM_FP8_SM90=0; the rows show each tile on its own).
--only large,decode,step runs some of the parts (the M = 4096 and square products; the decode products; the host
cost and training-step rows), for GPUs that run the whole suite in more time than one sitting allows."""

import statistics

from rocjit.bench import harness as H

SQUARE = (4096, 8192)
DEEPSEEK = ((2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168), (7168, 2048))   # (N, K) at M = 4096
DECODE_M = (1, 2, 4, 8, 16, 32, 64, 128)
ROUNDS = 5
DIAGNOSTIC_ROUNDS = 3
DECODE_NK = ((7168, 16384), (2112, 7168), (24576, 1536), (4096, 7168), (7168, 2048))   # every DeepSeek-V3 (N, K)


def _operands(M, N, K, torch, Q):
    """Quantized operands of every layout from bf16 random data: (xq, xs, wq, ws, wq_t, gq_t, gs_t, xq_t, xs_t)."""
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05
    xq, xs, _, _ = Q.quantize_fp8_dual(x)
    wq, ws, wq_t = Q.quantize_fp8_weight(w, transposed=True)
    return x, w, xq, xs, wq, ws, wq_t


def _cublaslt(torch):
    F = torch.nn.functional
    if not hasattr(F, "scaled_mm") or not hasattr(F, "ScalingType"):
        return None
    ST = F.ScalingType

    def run(xq, xs_cm, wq, ws_t):
        return F.scaled_mm(xq, wq.t(), xs_cm, ST.BlockWise1x128, ws_t, ST.BlockWise128x128,
                           output_dtype=torch.bfloat16)
    return run


def _time(fns, M, events: set, key=None, result=None):
    """µs per call of the callables `fns` (one per weight set, see run) as graph replays (50 for small M, 3 of at
    least 20 calls each for large M); where the capture fails, events (harness.time_graph_or_events), `key` added to
    `events` and a note, once, to `result`."""
    def note(text):
        if key not in events and result is not None:
            result.setdefault("notes", []).append(f"{key} at M={M}: {text}"[:300])
    us, how = H.time_graph_or_events(fns, reps=50 if M <= 256 else 3, warmup=3 if M <= 256 else 1, note=note)
    if how == "events":
        events.add(key)
    return us


def _time_all(fns: dict, M, events: set | None = None, result=None, rounds: int | None = None) -> dict:
    """µs of each of a shape's implementations (lists of callables, graph replays: see _time): one after the other
    for small M, else `rounds` (ROUNDS) rounds over all of them in turn (order reversed every other round), the
    median of each one's rounds. Keys timed with events instead are added to `events`."""
    events = set() if events is None else events
    if M <= 256:
        return {k: _time(f, M, events, k, result) for k, f in fns.items()}
    got = {k: [] for k in fns}
    names = list(fns)
    for r in range(ROUNDS if rounds is None else rounds):
        for k in (names if r % 2 == 0 else names[::-1]):
            got[k].append(_time(fns[k], M, events, k, result))
    return {k: statistics.median(v) for k, v in got.items()}


def _weight_sets(w, wq, ws, M, N, K, l2_bytes=None):
    """The weight operand sets each implementation of a product runs over: ([(FP8 weight, its scales)], [the bf16
    peer's weight, K-major]). Products of decode and prefill-chunk size (<= 256 rows) read their weights from memory,
    as in a model, so they get copies whose one pass exceeds twice the L2 (a single copy under 50 MB stayed in L2
    between graph replays, for rocjit and its peers alike); larger products get the weight itself."""
    rot = H.rotation_count(N * K * 2, l2_bytes=l2_bytes) if M <= 256 else 1
    return [(wq, ws)] + [(wq.clone(), ws.clone()) for _ in range(rot - 1)], [w.t().contiguous().t() for _ in range(rot)]


def _host_cost(result, torch, Q, op, lt):
    """Host µs per repeated eager call at 128 x 2112 x 7168 (NT; about 11 µs of GPU work): the op, cuBLASLt
    blockwise (where this torch has it) and bf16 torch.matmul, interleaved over rounds (rocjit.bench.decode.host_us)."""
    from rocjit.bench.decode import host_us
    M, N, K = 128, 2112, 7168
    x, w, xq, xs, wq, ws, _ = _operands(M, N, K, torch, Q)
    fns = {"ours": lambda: op(xq, xs, wq, ws)}
    if lt is not None:
        xs_cm, ws_t = xs.t().contiguous().t(), ws.t()
        fns["cublaslt_blockwise"] = lambda: lt(xq, xs_cm, wq, ws_t)
    wt = w.t().contiguous().t()
    fns["torch_matmul_bf16"] = lambda: torch.matmul(x, wt.t())
    for f in fns.values():          # tuning, compiles and the op's repeated-call entry stay out
        f()
        f()
    torch.cuda.synchronize()
    t = host_us(fns)
    ours = t.pop("ours")
    row = H.add_row(result, "host_cost_NT", (M, N, K), "e4m3-bf16", ours, t, None, timing="host")
    print(row, flush=True)


PARTS = ("large", "decode", "step")


def _args(argv):
    import argparse
    ap = argparse.ArgumentParser(prog="rocjit bench gemm_fp8")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--only", default=",".join(PARTS),
                    help=f"comma-separated parts to run, of {', '.join(PARTS)} (default: all)")
    a = ap.parse_args(argv)
    parts = {p.strip() for p in a.only.split(",") if p.strip()}
    if not parts or parts - set(PARTS):
        ap.error(f"--only takes parts of {', '.join(PARTS)}, got {a.only!r}")
    return a.quick, parts


def run(argv) -> dict:
    import torch
    from rocjit.ops import quant as Q
    from rocjit.ops.gemm_fp8 import gemm_fp8_blockwise
    quick, parts = _args(argv)
    ceil = H.measure_ceilings(matmul=True, fp8=True)
    result = H.new_result("gemm_fp8", ceil)
    peak = ceil.get("fp8_matmul_TFLOPs")
    result["ceilings"]["torch_version"] = torch.__version__
    lt = _cublaslt(torch)
    result["ceilings"]["cublaslt_blockwise"] = "present" if lt else f"absent (torch {torch.__version__})"

    if parts != set(PARTS):
        result.setdefault("notes", []).append(f"parts run: {', '.join(p for p in PARTS if p in parts)}")
    cases = [(m, m, m) for m in (SQUARE[:1] if quick else SQUARE)]
    cases += [(4096, n, k) for n, k in (DEEPSEEK[:2] if quick else DEEPSEEK)]
    decode = [(m, n, k) for n, k in (DECODE_NK[:1] if quick else DECODE_NK) for m in ((1, 32, 128) if quick else DECODE_M)]
    for M, N, K in (cases if "large" in parts else []) + (decode if "decode" in parts else []):
        x, w, xq, xs, wq, ws, wq_t = _operands(M, N, K, torch, Q)
        flops = 2.0 * M * N * K
        qsets, wts = _weight_sets(w, wq, ws, M, N, K)
        peer_fns = {}
        if lt is not None:
            try:
                xs_cm = xs.t().contiguous().t()             # (M, K/128) with strides (1, M)
                ws_t = ws.t()                              # (K/128, N/128) for B given as (K, N)
                got = lt(xq, xs_cm, wq, ws_t)
                ref = gemm_fp8_blockwise(xq, xs, wq, ws)
                if torch.allclose(got.float(), ref.float(), rtol=2e-2, atol=2e-2 * ref.float().abs().max().item()):
                    peer_fns["cublaslt_blockwise"] = [lambda q=q, sc=sc: lt(xq, xs_cm, q, sc.t()) for q, sc in qsets]
                else:
                    result.setdefault("notes", []).append(f"cuBLASLt blockwise disagrees at {M}x{N}x{K}: not timed")
            except Exception as e:     # shapes this cuBLASLt refuses (e.g. M not a multiple of 16 on some builds)
                result.setdefault("notes", []).append(f"cuBLASLt blockwise {M}x{N}x{K}: {type(e).__name__}: {e}"[:200])
        peer_fns["torch_matmul_bf16"] = [lambda wt=wt: torch.matmul(x, wt.t()) for wt in wts]
        layouts = {"NT": [lambda q=q, sc=sc: gemm_fp8_blockwise(xq, xs, q, sc) for q, sc in qsets]}
        tn_peer = None
        if M >= 128:    # the backward layouts of training shapes (decode has no backward)
            # dgrad NN: C[M, N] = G[M, K] . B[K, N], B = W^T as a view of K-major memory
            layouts["NN"] = [lambda q=q, sc=sc: gemm_fp8_blockwise(xq, xs, q.t(), sc.t(), layout="NN")
                             for q, sc in qsets]
            # wgrad TN: C[M, N] = A[K, M]^T . B[K, N], 1 x 128 scales along K (tokens) on both sides, the
            # operands quantized as FP8Linear's backward does (quantize_fp8_dual(transpose_col=True)); both are
            # activations (gradients and inputs), one set of them
            tn = _wgrad_operands(M, N, K, torch, Q)
            layouts["TN"] = [lambda: gemm_fp8_blockwise(tn[0].t(), tn[1].t(), tn[2].t(), tn[3].t(), layout="TN")]
            tn_peer = _cublaslt_1x128_1x128(result, tn, layouts["TN"][0], M, N, K, torch)
        diagnostic = _wgmma_rows(result, xq, xs, qsets, M, N, K, layouts["NT"][0], torch) if M >= 128 else {}
        for impl in list(layouts.values()) + list(diagnostic.values()):
            for fn in impl:
                fn()
        # each layout next to its peer, the per-config rows in rounds of their own (see the module doc)
        fns = {("ours", "NT"): layouts["NT"]}
        fns.update({("peer", k): f for k, f in peer_fns.items()})
        fns.update({("ours", k): f for k, f in layouts.items() if k != "NT"})
        if tn_peer is not None:                         # cuBLASLt with TN's own scale recipe
            fns[("peer", "cublaslt_blockwise_1x128_1x128")] = [tn_peer]
        events: set = set()
        times = _time_all(fns, M, events, result)
        times.update(_time_all({("ours", k): f for k, f in diagnostic.items()}, M, events, result,
                               rounds=DIAGNOSTIC_ROUNDS))
        layouts.update(diagnostic)
        peers = {k: times[("peer", k)] for k in peer_fns}
        for lay in layouts:
            us = times[("ours", lay)]
            row_peers = dict(peers)
            if lay == "TN" and tn_peer is not None:
                row_peers["cublaslt_blockwise_1x128_1x128"] = times[("peer", "cublaslt_blockwise_1x128_1x128")]
            row = H.add_row(result, f"gemm_fp8_blockwise_{lay}", (M, N, K), "e4m3-bf16", us, row_peers,
                            flops / (peak * 1e12) * 1e6 if peak else None,
                            timing="events" if ("ours", lay) in events else "graph",
                            tflops=flops / us / 1e6,
                            peers_tflops={p: flops / v / 1e6 for p, v in row_peers.items() if v},
                            pct_dense_peak=100 * flops / us / 1e6 / peak if peak else None)
            print(row, flush=True)
        torch.cuda.empty_cache()

    if "step" in parts:
        _host_cost(result, torch, Q, gemm_fp8_blockwise, lt)
        _training_step(result, quick, torch)
    return result


def _wgrad_operands(M, N, K, torch, Q):
    """wgrad's quantized operands from bf16 random data: (gq_t [M, K], gs_t [M, K/128], xq_t [N, K], xs_t [N, K/128]):
    the transposed outputs of quantize_fp8_dual over the K = tokens rows of G [K, M] and X [K, N]."""
    g = torch.randn(K, M, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    gq_t, gs_t = Q.quantize_fp8_dual(g, transpose_col=True)[2:]
    xq_t, xs_t = Q.quantize_fp8_dual(x, transpose_col=True)[2:]
    return gq_t, gs_t, xq_t, xs_t


def _cublaslt_1x128_1x128(result, tn, ours, M, N, K, torch):
    """cuBLASLt computing TN's product (1 x 128 scales on both operands, torch's BLOCK_1x128_1x128 recipe), or None
    where this torch lacks it. The scale layout it takes is found by trying the candidates against our output."""
    F = torch.nn.functional
    if not hasattr(F, "scaled_mm") or not hasattr(F, "ScalingType"):
        return None
    ST = F.ScalingType
    gq_t, gs_t, xq_t, xs_t = tn
    ref = ours().float()
    tol = 2e-2 * ref.abs().max().item()
    sa = gs_t.t().contiguous().t()                      # (M, K/128), strides (1, M), as for the forward recipe
    tried = []
    for sb in (xs_t, xs_t.t().contiguous().t(), xs_t.contiguous(), xs_t.t(), xs_t.t().contiguous()):
        def run(sb=sb):
            return F.scaled_mm(gq_t, xq_t.t(), sa, ST.BlockWise1x128, sb, ST.BlockWise1x128,
                               output_dtype=torch.bfloat16)
        try:
            got = run().float()
        except Exception as e:
            tried.append(f"{tuple(sb.shape)}/{sb.stride()}: {type(e).__name__}: {str(e)[:120]}")
            continue
        if ((got - ref).abs() <= tol).all():
            return run
        tried.append(f"{tuple(sb.shape)}/{sb.stride()}: disagrees")
    note = f"cuBLASLt 1x128 x 1x128 at {M}x{N}x{K}: not timed ({'; '.join(tried)})"
    result.setdefault("notes", []).append(note[:600])
    return None


def _wgmma_rows(result, xq, xs, qsets, M, N, K, op_nt, torch):
    """{'NT_wgmma_<cfg>' / 'NT_tma_<cfg>': [a launch per weight set of qsets]} for each config of the two sm_90a
    kernels, and the TMA kernel's tail-split twins where this shape has them (suffix t<ranges>), whose output matches
    the op's NT output (one that disagrees or fails is not timed; a note says so)."""
    from rocjit.ops import _gemm
    from rocjit.ops import gemm_fp8 as G
    target, _, sms = _gemm._device(xq.device.index or 0)
    if not G.is_sm90a(target):
        return {}
    ref = op_nt().float()
    tol = 2e-2 * ref.abs().max().item()
    a_km, sa = xq.view(torch.uint8), G._strided(xs)
    bsets = [(q.view(torch.uint8), G._strided(sc)) for q, sc in qsets]
    out = {}
    cands = [c for c in G.candidates(target, G._smem_limit(xq.device.index or 0), sm90=True)
             if c.get("kernel") in ("sm90", "tma")]
    for cfg in cands + G.tail_candidates(M, N, K, sms, cands):
        c = torch.full((M, N), float("nan"), device=xq.device, dtype=torch.bfloat16)
        fns = [lambda cfg=cfg, c=c, b_km=b_km, sb=sb: G._launch(cfg, c, a_km, b_km, sa, sb, M, N, K, False, False)
               for b_km, sb in bsets]
        try:
            fns[0]()
            bad = int(((c.float() - ref).abs() > tol).sum()) + int(c.isnan().sum())
        except Exception as e:
            bad = f"{type(e).__name__}: {e}"[:200]
        if bad:
            result.setdefault("notes", []).append(f"wgmma kernel {cfg} at {M}x{N}x{K}: {bad} (elements wrong): not timed")
            continue
        kind = "tma" if cfg["kernel"] == "tma" else "wgmma"
        tail = ("ws" if cfg.get("ws") else "") + ("p" if cfg.get("pipe") else "") + \
            (f"c{cfg['cluster']}" if cfg.get("cluster", 1) > 1 else "") + (f"k{cfg['kwg']}" if "kwg" in cfg else "") + \
            (f"t{cfg['tail']}" if "tail" in cfg else "")
        out[f"NT_{kind}_{cfg['bm']}x{cfg['bn']}s{cfg['stages']}{tail}"] = fns
    return out


def _training_step(result, quick, torch):
    """forward + backward of Linear(D, F) -> GELU -> Linear(F, D) on T tokens: FP8Linear (torch's GELU between) and
    FP8MLP (the GELU fused into the quantizers) vs nn.Linear (bf16), in rounds that take the three in turn; then
    the forward alone under torch.no_grad(), the same way."""
    from rocjit.nn import FP8Linear, FP8MLP
    T, D, F = (4096, 2048, 8192) if quick else (8192, 4096, 14336)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(D, F, bias=False), torch.nn.GELU(),
                              torch.nn.Linear(F, D, bias=False)).cuda().to(torch.bfloat16)
    fp8 = torch.nn.Sequential(FP8Linear.from_linear(ref[0]), torch.nn.GELU(), FP8Linear.from_linear(ref[2]))
    fused = FP8MLP.from_sequential(ref)
    x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)

    def step(model):
        def f():
            y = model(x)
            y.backward(gy)
        return f

    def forward(model):
        def f():
            with torch.no_grad():
                model(x)
        return f

    # ROUNDS rounds, median of each, as the GEMM rows: timed once each, fp8 then bf16, the bf16 step read 8814 us in
    # one H200 run and 7870 in the next on the same code. Then the forward alone without grad mode (inference: the
    # layers quantize x by row blocks only and W without its transposed copy), the same way.
    models = (("fp8", fp8), ("fp8_mlp", fused), ("bf16", ref))
    for make, passes, cases in ((step, 3, ("mlp_train_step", "mlp_train_step_fused_act")),
                                (forward, 1, ("mlp_inference_fwd", "mlp_inference_fwd_fused_act"))):
        runs = {name: [] for name, _ in models}
        for r in range(1 if quick else ROUNDS):
            for name, m in (models if r % 2 == 0 else models[::-1]):
                runs[name].append(H.time_events(make(m), warmup=3, reps=10))
        times = {name: statistics.median(v) for name, v in runs.items()}
        flops = passes * 2 * 2.0 * T * D * F
        for case, name in zip(cases, ("fp8", "fp8_mlp")):
            row = H.add_row(result, case, (T, D, F), "fp8-blockwise vs bf16", times[name],
                            {"torch_linear_bf16": times["bf16"]}, None, timing="events",
                            tflops=flops / times[name] / 1e6,
                            peers_tflops={"torch_linear_bf16": flops / times["bf16"] / 1e6},
                            rounds_us={name: runs[name], "bf16": runs["bf16"]})
            print(row, flush=True)


def plot(result: dict, path: str) -> None:
    """The panels of the parts in `result`: the large products' TFLOP/s per shape (each layout of the op, the fastest
    single TMA config timed beside it, cuBLASLt blockwise, cuBLASLt's 1 x 128 x 1 x 128 recipe for TN, bf16
    torch.matmul; the measured FP8 matmul ceiling as a line); decode products' speedup over cuBLASLt blockwise
    against M, one line per weight shape; the training-step rows as µs bars against bf16."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in result["rows"] if r.get("ours_us")]
    op = [r for r in rows if r["case"] in ("gemm_fp8_blockwise_NT", "gemm_fp8_blockwise_NN", "gemm_fp8_blockwise_TN")]
    large = [r for r in op if r["shape"][0] not in DECODE_M]
    decode = [r for r in op if r["shape"][0] in DECODE_M and r["case"].endswith("_NT")]
    step = [r for r in rows if r["case"].startswith("mlp_")]
    panels = [p for p, have in (("large", large), ("decode", decode), ("step", step)) if have]
    if not panels:
        return H.plot(result, path)
    widths = {"large": 3, "decode": 1.4, "step": 1.2}
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(5 * widths[p] for p in panels), 5.5), squeeze=False,
                             gridspec_kw={"width_ratios": [widths[p] for p in panels]})
    for ax, part in zip(axes.flat, panels):
        if part == "large":
            shapes = sorted({tuple(r["shape"]) for r in large}, key=lambda s: (not s[0] == s[1] == s[2], s))
            by = {(r["case"].rsplit("_", 1)[1], tuple(r["shape"])): r for r in large}
            best = {}                       # the fastest single TMA config timed for each shape (NT)
            for r in rows:
                if r["case"].startswith("gemm_fp8_blockwise_NT_tma_") and r.get("tflops"):
                    s = tuple(r["shape"])
                    if s not in best or r["tflops"] > best[s]["tflops"]:
                        best[s] = r
            def ours(lay):
                return lambda s: by.get((lay, s), {}).get("tflops")

            def peer(lay, name):
                return lambda s: by.get((lay, s), {}).get("peers_tflops", {}).get(name)
            series = [("rocjit NT", ours("NT")), ("rocjit NN", ours("NN")), ("rocjit TN", ours("TN")),
                      ("rocjit NT, fastest single TMA config", lambda s: best.get(s, {}).get("tflops")),
                      ("cuBLASLt blockwise (NT recipe)", peer("NT", "cublaslt_blockwise")),
                      ("cuBLASLt 1x128 x 1x128 (TN recipe)", peer("TN", "cublaslt_blockwise_1x128_1x128")),
                      ("torch.matmul bf16", peer("NT", "torch_matmul_bf16"))]
            series = [(name, get) for name, get in series if any(get(s) for s in shapes)]
            w = 0.8 / max(1, len(series))
            for i, (name, get) in enumerate(series):
                xs = [j + (i - (len(series) - 1) / 2) * w for j in range(len(shapes))]
                ax.bar(xs, [get(s) or 0 for s in shapes], w, label=name)
            ceiling = result.get("ceilings", {}).get("fp8_matmul_TFLOPs")
            if ceiling:
                ax.axhline(ceiling, color="gray", ls=":", label=f"FP8 matmul ceiling measured ({ceiling:.0f})")
            ax.set_xticks(range(len(shapes)))
            ax.set_xticklabels([f"{m}x{n}x{k}" for m, n, k in shapes], rotation=20, fontsize=8)
            ax.set_ylabel("TFLOP/s")
            ax.set_title("blockwise FP8, large products (M x N x K)", fontsize=10)
            ax.legend(fontsize=7, ncol=2)
        elif part == "decode":
            for nk in sorted({tuple(r["shape"][1:]) for r in decode}):
                pts = sorted((r["shape"][0], r["peers_us"]["cublaslt_blockwise"] / r["ours_us"]) for r in decode
                             if tuple(r["shape"][1:]) == nk and r["peers_us"].get("cublaslt_blockwise"))
                if pts:
                    ax.plot(*zip(*pts), "o-", label=f"N x K = {nk[0]} x {nk[1]}")
            ax.axhline(1.0, color="gray", ls=":")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("M (rows)")
            ax.set_ylabel("speedup over cuBLASLt blockwise")
            ax.set_title("decode products, NT", fontsize=10)
            ax.legend(fontsize=7)
        else:
            names = [r["case"] for r in step]
            ax.bar([i - 0.2 for i in range(len(step))], [r["ours_us"] for r in step], 0.4, label="rocjit FP8")
            ax.bar([i + 0.2 for i in range(len(step))], [r["peers_us"]["torch_linear_bf16"] for r in step], 0.4,
                   label="bf16 nn.Linear")
            for i, r in enumerate(step):
                ax.annotate(f"{r['peers_us']['torch_linear_bf16'] / r['ours_us']:.2f}x", (i, r["ours_us"]),
                            ha="center", va="bottom", fontsize=8)
            ax.set_xticks(range(len(step)))
            ax.set_xticklabels(names, rotation=20, fontsize=7)
            ax.set_ylabel("µs")
            t, d, f = step[0]["shape"]
            ax.set_title(f"MLP block {d} -> {f} -> {d}, {t} tokens", fontsize=10)
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"rocjit {result['suite']} — {result['gpu']} — {result['commit']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
