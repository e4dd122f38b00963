"""Skinny GEMM for decode: C[M, N] = A[M, K] . W[N, K]^T with M <= 32, FP8 (e4m3) or bf16/fp16.

    c = rocjit.ops.skinny_gemm(a, w)                                   # bf16 / fp16
    c = rocjit.ops.skinny_gemm(a8, w8, scale_a=sa, scale_w=sw)         # FP8, C = (A W^T) * sa * sw

FP8 scales are float32 device tensors: `scale_a` one element (per tensor), `scale_w` one element or
N (per output channel). Matrix-core kernel (skinny_gemm.hip) on NVIDIA sm_89+ and AMD CDNA, the
portable kernel (gemv.hip) elsewhere; split-K reductions run in a fixed order (deterministic).
Configs come from rocjit.tune (tuned once per shape bucket, then persisted).
"""
import functools
import sys
from typing import Optional

from rocjit import tune
from rocjit.ops import _common as C

MAX_M = 32
_SRC = "skinny_gemm.hip"
_GEMV_SRC = "gemv.hip"


# ----------------------------------------------------------------------------- device facts
@functools.lru_cache(maxsize=None)
def _device(dev: int) -> tuple[str, str, int]:
    """(target, name, multiprocessor count) of a device."""
    from rocjit import platform
    plat = platform.get()
    attrs = plat.device_attributes(dev)
    sms = attrs.get("sm_count") or attrs.get("cu_count") or attrs.get("multiprocessor_count") or 100
    return plat.device_target(dev), plat.device_name(dev), int(sms)


def has_matrix_path(target: str, fp8: bool) -> bool:
    """mma.sync needs sm_80 (bf16/f16) / sm_89 (e4m3); MFMA needs CDNA (gfx90a+; fp8 natively on gfx942/950)."""
    if target.startswith("sm_"):
        cc = int("".join(ch for ch in target[3:] if ch.isdigit()))
        return cc >= (89 if fp8 else 80)
    return target.startswith(("gfx90a", "gfx94", "gfx95"))


@functools.lru_cache(maxsize=None)
def _module(src: str):
    import rocjit
    return rocjit.Module(src)


def _kernel(src: str, name: str):
    return _module(src)[name]


# ----------------------------------------------------------------------------- type names
def _elem_kind(dtype) -> str:
    import torch
    if dtype == torch.bfloat16:
        return "skinny::bf16_t"
    if dtype == torch.float16:
        return "skinny::f16_t"
    return "skinny::e4m3_t"


def ctype(dtype) -> str:
    import torch
    return {torch.bfloat16: "__hip_bfloat16", torch.float16: "__half", torch.float32: "float"}[dtype]


def _is_fp8(dtype) -> bool:
    import torch
    return dtype in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e4m3fnuz", None))


# ----------------------------------------------------------------------------- configs
_MMA_SHAPES = ((1, 8, 2), (2, 4, 2), (2, 8, 2), (1, 4, 4))   # (MT, WARPS_K, UNROLL) that won a first sweep
_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)


def mma_candidates(M: int, N: int, K: int, sms: int, elem_bytes: int = 2) -> list[dict]:
    """Matrix-core configs worth timing: rows per warp (MT tiles of 16), warps splitting K in a block,
    k-blocks in flight, and grid split-K (fills the GPU at small N and evens out the last wave; the
    fp32 partials cost splits * M * N * 8 bytes of traffic)."""
    out = []
    nkb = -(-K * elem_bytes // 64)                      # 64-byte k-blocks per row
    for mt, wk, un in _MMA_SHAPES:
        blocks = -(-N // (16 * mt))
        for splits in _SPLITS:
            if splits > 1 and (blocks * splits > 24 * sms or nkb < splits * wk * un
                               or splits * M * N * 8 > 0.1 * N * K * elem_bytes):
                continue
            out.append({"path": "mma", "mt": mt, "warps_k": wk, "unroll": un, "splits": splits})
    return out


def mma_default(M: int, N: int, K: int, sms: int, elem_bytes: int = 2) -> dict:
    """Built-in default: MT=1 (MT=2 from 16 rows up), enough splits for ~4 blocks per multiprocessor."""
    mt = 2 if M > 8 else 1
    blocks = -(-N // (16 * mt))
    cands = [c for c in mma_candidates(M, N, K, sms, elem_bytes) if c["mt"] == mt]
    splits = max((c["splits"] for c in cands if blocks * c["splits"] <= 4 * sms), default=1)
    return {"path": "mma", "mt": mt, "warps_k": 8 if mt == 1 else 4, "unroll": 2, "splits": splits}


# (MT, CW, BK bytes, PW): the configs that won somewhere in an H100 sweep of the seed shapes
_STREAM_SHAPES = ((1, 4, 512, 4), (1, 4, 512, 2), (2, 4, 256, 4), (1, 8, 256, 4))
_STREAM_SMEM = 227 * 1024 - 2048            # H100 opt-in shared memory per block, less static + barriers


def has_stream_path(target: str) -> bool:
    """The streamed kernel's mbarrier waits (try_wait.parity) need sm_90 (Hopper) or newer."""
    if not target.startswith("sm_"):
        return False
    return int("".join(ch for ch in target[3:] if ch.isdigit())) >= 90


def stream_stages(M: int, cfg: dict, smem: int = _STREAM_SMEM) -> int:
    """Ring depth that fits the blocks per SM asked for (0 when fewer than 3 stages fit)."""
    rows = 16 * cfg["mt"] * cfg["cw"] + 8 * -(-M // 8)
    stages = min(8, (smem // cfg["cps"]) // (rows * (cfg["bk"] + 16)))
    return stages if stages >= 3 else 0


def stream_candidates(M: int, N: int, K: int, sms: int, elem_bytes: int = 2) -> list[dict]:
    """Persistent stream-K configs of skinny_stream_kernel: rows per consumer warp (MT tiles of 16),
    consumer warps, bytes of K per chunk, producer warps, blocks per SM. ROCJIT_SKINNY_STREAM=0 turns the path off."""
    import os
    if os.environ.get("ROCJIT_SKINNY_STREAM", "1") == "0":
        return []
    out = []
    for mt, cw, bk, pw in _STREAM_SHAPES:
        if bk > 2 * K * elem_bytes and bk > 256:        # chunks mostly past the end of short rows
            continue
        if M > 16 and mt * cw < 8:                      # 32 activation rows per 64 weight rows: too much L2 traffic
            continue
        cfg = {"path": "stream", "mt": mt, "cw": cw, "bk": bk, "pw": pw, "cps": 1}
        if stream_stages(M, cfg) >= 3:
            out.append(cfg)
    return out


def portable_candidates(M: int) -> list[dict]:
    return [{"path": "portable", "p": p, "rows": r, "unroll": u}
            for p, r, u in ((32, 4, 2), (16, 8, 2), (8, 16, 2))]


def _m_tiles(M: int, target: str) -> int:
    rows = 8 if target.startswith("sm_") else 16       # activation rows per matrix instruction
    return -(-M // rows)


def _mb(M: int) -> int:
    return 1 if M <= 1 else 2 if M <= 2 else 4 if M <= 4 else 8 if M <= 8 else 16 if M <= 16 else 32


# ----------------------------------------------------------------------------- launches
def launch_mma(a, w, out, scale_a, scale_w, M: int, N: int, K: int, cfg: dict, target: str, wave: int):
    """C = A W^T (* scales) with skinny_gemm_kernel; split-K partials reduced by skinny_splitk_reduce."""
    import torch
    nt = _m_tiles(M, target)
    mt, wk, un, splits = cfg["mt"], cfg["warps_k"], cfg["unroll"], cfg["splits"]
    per16 = 16 // a.element_size()
    nkb = -(-K // (4 * per16))
    kb_per_split = -(-nkb // splits)
    splits = -(-nkb // kb_per_split)
    per_row = int(scale_w is not None and scale_w.numel() > 1)
    name = f"skinny_gemm_kernel<{_elem_kind(a.dtype)}, {ctype(out.dtype)}, {mt}, {nt}, {wk}, {un}>"
    grid = (-(-N // (16 * mt)), splits)
    k = _kernel(_SRC, name)
    if splits == 1:
        k[grid, wk * wave](a, w, out, None, scale_a, scale_w, per_row, M, N, K, kb_per_split)
        return out
    partial = torch.empty((splits, M, N), dtype=torch.float32, device=a.device)
    k[grid, wk * wave](a, w, out, partial, scale_a, scale_w, per_row, M, N, K, kb_per_split)
    r = _kernel(_SRC, f"skinny_splitk_reduce<{ctype(out.dtype)}>")
    r[-(-(M * N) // 256), 256](partial, out, scale_a, scale_w, per_row, M, N, splits)
    return out


_tickets: dict = {}
_spare_tickets: dict = {}


def _tickets_for(device, tiles: int):
    """Zeroed per-tile tickets of the stream kernel, one buffer per (device, stream): the kernel resets
    each ticket it uses, so a buffer stays zero between launches and graph replays. A graph being
    captured on a new stream takes a buffer zeroed beforehand (no memset captured into the graph)."""
    import torch
    size = max(tiles, 4096)
    key = (device.index, torch.cuda.current_stream(device).cuda_stream)
    buf = _tickets.get(key)
    if buf is not None and buf.numel() >= size:
        return buf
    spares = _spare_tickets.setdefault(device.index, [])
    if torch.cuda.is_current_stream_capturing():
        fit = [b for b in spares if b.numel() >= size]
        if not fit:
            return torch.zeros(size, dtype=torch.int32, device=device)   # valid for this graph only
        buf = fit[0]
        spares.remove(buf)
    else:
        buf = torch.zeros(size, dtype=torch.int32, device=device)
        while len(spares) < 8:
            spares.append(torch.zeros(max(size, 16384), dtype=torch.int32, device=device))
    _tickets[key] = buf
    return buf


def launch_stream(a, w, out, scale_a, scale_w, M: int, N: int, K: int, cfg: dict, sms: int):
    """C = A W^T (* scales) with skinny_stream_kernel: one launch, stream-K, fixed-order fix-up."""
    import torch
    nt = -(-M // 8)
    mt, cw, bk, pw, cps = cfg["mt"], cfg["cw"], cfg["bk"], cfg["pw"], cfg["cps"]
    stages = cfg.get("stages") or stream_stages(M, cfg)
    rows = 16 * mt * cw
    tiles = -(-N // rows)
    total = tiles * -(-K * a.element_size() // bk)
    grid = max(1, min(sms * cps, total))
    ws = torch.empty(grid * 2 * cw * 32 * mt * nt * 4, dtype=torch.float32, device=a.device)
    smem = stages * (rows + 8 * nt) * (bk + 16) + 16 * stages
    per_row = int(scale_w is not None and scale_w.numel() > 1)
    name = f"skinny_stream_kernel<{_elem_kind(a.dtype)}, {ctype(out.dtype)}, {mt}, {nt}, {cw}, {bk}, {stages}, {pw}>"
    _kernel(_SRC, name)[grid, (cw + pw) * 32](a, w, out, ws, _tickets_for(a.device, tiles), scale_a, scale_w, per_row,
                                             M, N, K, shared_mem=smem)
    return out


def launch_portable(x, xt: str, wk: str, w, out, w_scale, w_zero, group_size: int, per_row: int, scale_a,
                    st: str, M: int, N: int, K: int, cfg: dict):
    """gemv.hip's portable kernel: cfg p threads per team, rows (teams) per block, unroll, rt rows per team."""
    p, rows, un, rt = cfg["p"], cfg["rows"], cfg["unroll"], cfg.get("rt", 1)
    name = f"gemv_kernel<{xt}, {wk}, {st}, {ctype(out.dtype)}, {p}, {rows}, {_mb(M)}, {un}, {rt}>"
    _kernel(_GEMV_SRC, name)[-(-N // (rows * rt)), p * rows](w, x, out, w_scale, w_zero, group_size, per_row,
                                                             scale_a, N, K, M)
    return out


# ----------------------------------------------------------------------------- the op
def _check(a, w, scale_a, scale_w, out_dtype, out):
    import torch
    if not (isinstance(a, torch.Tensor) and isinstance(w, torch.Tensor)):
        raise TypeError(f"skinny_gemm: a and w must be torch tensors, got {type(a).__name__} and {type(w).__name__}")
    if a.dim() != 2 or w.dim() != 2:
        raise ValueError(f"skinny_gemm: expected a [M, K] and w [N, K], got shapes {tuple(a.shape)} and {tuple(w.shape)}")
    M, K = a.shape
    N = w.shape[0]
    if w.shape[1] != K:
        raise ValueError(f"skinny_gemm: a is [M={M}, K={K}] but w is {tuple(w.shape)}; w must be [N, K={K}]")
    if M > MAX_M:
        raise ValueError(f"skinny_gemm handles M <= {MAX_M} rows of a (decode batches); got M={M}. Use a general "
                         f"GEMM for larger M: torch.matmul(a, w.t()) or torch._scaled_mm for FP8")
    if M < 1 or N < 1:
        raise ValueError(f"skinny_gemm: empty problem M={M}, N={N}")
    if K % 16:
        raise ValueError(f"skinny_gemm: K={K} must be a multiple of 16 (16-byte weight loads)")
    if a.dtype != w.dtype:
        raise TypeError(f"skinny_gemm: a and w must share a dtype, got {a.dtype} and {w.dtype}")
    fp8 = _is_fp8(a.dtype)
    if not fp8 and a.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"skinny_gemm: dtype must be float8_e4m3fn / float8_e4m3fnuz, bfloat16 or float16, got {a.dtype}")
    if a.device != w.device or a.device.type != "cuda":
        raise ValueError(f"skinny_gemm: a and w must be on the same GPU, got {a.device} and {w.device}")
    if not w.is_contiguous():
        raise ValueError("skinny_gemm: w must be contiguous (row-major [N, K]); copying weights per call is not free")
    for nm, s, allowed in (("scale_a", scale_a, (1,)), ("scale_w", scale_w, (1, N))):
        if s is None:
            continue
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or s.device != a.device:
            raise TypeError(f"skinny_gemm: {nm} must be a float32 tensor on {a.device} (no host sync in a decode step)")
        if s.numel() not in allowed:
            raise ValueError(f"skinny_gemm: {nm} must have {' or '.join(map(str, allowed))} elements, got {s.numel()}")
    od = out_dtype if out_dtype is not None else (torch.bfloat16 if fp8 else a.dtype)
    if od not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"skinny_gemm: out_dtype must be bfloat16, float16 or float32, got {od}")
    if out is not None:
        if out.shape != (M, N) or out.dtype != od or out.device != a.device or not out.is_contiguous():
            raise ValueError(f"skinny_gemm: out must be a contiguous {od} tensor of shape ({M}, {N}) on {a.device}, "
                             f"got {out.dtype} {tuple(out.shape)} on {out.device}")
    return M, N, K, fp8, od


def aligned_operands(op: str, a, w, out=None):
    """The kernels move 16 bytes at a time: activations whose data pointer is not 16-byte aligned are copied to
    fresh (aligned) memory; a misaligned weight matrix or out= is an error (copying a weight on every call would
    hide a large cost, and out= must be written in place)."""
    for name, t in (("w", w), ("out", out)):
        if t is not None and not C.aligned(t):
            raise ValueError(f"{op}: {name}'s data pointer {t.data_ptr():#x} is not 16-byte aligned (the kernels "
                             f"move 16 bytes at a time); pass an aligned tensor, e.g. {name}.clone()")
    return a if C.aligned(a) else a.clone()


def config_for(a, w, out, scale_a, scale_w, M, N, K, fp8):
    """The tuned (or default) config of this problem and the function that runs it."""
    target, devname, sms = _device(a.device.index or 0)
    wave = 32 if target.startswith("sm_") else 64
    eb = a.element_size()
    if has_matrix_path(target, fp8):
        cands, default = mma_candidates(M, N, K, sms, eb), mma_default(M, N, K, sms, eb)
        if has_stream_path(target):                  # a and w are 16-byte aligned (aligned_operands)
            cands = stream_candidates(M, N, K, sms, eb) + cands
    else:
        cands, default = portable_candidates(M), portable_candidates(M)[0]

    def run(cfg, w=w):
        if cfg["path"] == "mma":
            return launch_mma(a, w, out, scale_a, scale_w, M, N, K, cfg, target, wave)
        if cfg["path"] == "stream":
            return launch_stream(a, w, out, scale_a, scale_w, M, N, K, cfg, sms)
        xt = "unsigned char" if fp8 else ctype(a.dtype)
        wk = ("gemv::w_e4m3fnuz" if "fnuz" in str(a.dtype) else "gemv::w_e4m3") if fp8 else \
            ("gemv::w_bf16" if "bfloat16" in str(a.dtype) else "gemv::w_f16")
        per_row = int(scale_w is not None and scale_w.numel() > 1)
        return launch_portable(a, xt, wk, w, out, scale_w, None, 0, per_row, scale_a, "float", M, N, K, cfg)

    copies = []

    def bench(cfg):
        if not copies:
            copies.extend(tune.rotation_copies(w))
        return tune.time_graph([functools.partial(run, cfg, c) for c in copies])

    cfg = tune.pick("skinny_gemm", bucket=tune.bucket(m=M, n=N, k=K), dtype=str(a.dtype).replace("torch.", ""),
                    device=devname, src_hash=src_hash(), candidates=cands, default=default, bench=bench)
    return cfg, run


@functools.lru_cache(maxsize=1)
def src_hash() -> str:
    from rocjit.compiler import kernels_src_dir
    return tune.source_hash(kernels_src_dir() / _SRC, kernels_src_dir() / _GEMV_SRC)


_OUT_DTYPES = {"bfloat16", "float16", "float32"}


def _launch(a, w, scale_a, scale_w, od, out):
    import torch
    M, N, K, fp8, od = _check(a, w, scale_a, scale_w, od, out)
    a = aligned_operands("skinny_gemm", a.contiguous(), w, out)
    if out is None:
        out = torch.empty((M, N), dtype=od, device=a.device)
    cfg, run = config_for(a, w, out, scale_a, scale_w, M, N, K, fp8)
    run(cfg)
    return out


def _torch_op():
    """torch.ops.rocjit.skinny_gemm (what torch.compile traces)."""
    return C.custom_op("skinny_gemm", _op_functions)


def _op_functions():
    """(impl, fake) of torch.ops.rocjit.skinny_gemm."""
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(a: Tensor, w: Tensor, scale_a: Optional[Tensor], scale_w: Optional[Tensor], out_dtype: str) -> Tensor:
        return _launch(a, w, scale_a, scale_w, getattr(tm, out_dtype), None)

    def fake(a, w, scale_a, scale_w, out_dtype):
        return a.new_empty((a.shape[0], w.shape[0]), dtype=getattr(tm, out_dtype))

    return impl, fake


def skinny_gemm(a, w, *, scale_a=None, scale_w=None, out_dtype=None, out=None):
    """C = A W^T for A [M <= 32, K], W [N, K] (K % 16 == 0). FP8: C = (A W^T) * scale_a * scale_w
    with float32 scales (scale_a 1 element, scale_w 1 or N); out_dtype defaults to bfloat16 for FP8 and
    to the input dtype otherwise. Deterministic (fixed-order split-K). Inputs may be torch, cupy or
    numpy arrays; the result comes back in a's framework."""
    op = "skinny_gemm"
    at, fw = C.to_torch(a, "a", op)
    wt = C.to_torch(w, "w", op)[0]
    sa = C.to_torch(scale_a, "scale_a", op)[0] if scale_a is not None else None
    sw = C.to_torch(scale_w, "scale_w", op)[0] if scale_w is not None else None
    ot = C.to_torch(out, "out", op)[0] if out is not None else None
    if C.compiling():
        _, _, _, _, od = _check(at, wt, sa, sw, out_dtype, ot)
        y = _torch_op()(at, wt, sa, sw, str(od).replace("torch.", ""))
        if ot is not None:
            ot.copy_(y)
            y = ot
    else:
        _torch_op()   # registered eagerly: torch.compile cannot register it while tracing
        y = _launch(at, wt, sa, sw, out_dtype, ot)
    if out is not None and fw != "torch":
        return out if fw != "numpy" else _copy_back(out, y)
    return C.convert_outputs(y, fw)


def _copy_back(host, y):
    import numpy as np
    np.copyto(host, C.from_torch(y, "numpy"))
    return host


if "torch" in sys.modules:     # torch already loaded: register now, so a first call under torch.compile finds it
    _torch_op()
