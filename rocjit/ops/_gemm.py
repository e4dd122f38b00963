"""GEMM host code shared by the GEMV and skinny-GEMM ops (and the GEMMs that will follow): device facts, type
names, the tuner's candidate configurations, the launch helpers of each kernel path, operand alignment.

Launch helpers take the op's `Call` (rocjit.ops._op) last, so an eager call records its launches and scratch
tensors into a plan; the tuner and the tests pass nothing and just launch.
"""
import functools
import os
import threading

from rocjit import targets, tune
from rocjit.ops import _common as C
from rocjit.ops._op import UNRECORDED

SRC = "skinny_gemm.hip"
GEMV_SRC = "gemv.hip"
SCALE_W_PER_COLUMN, SCALE_A_PER_ROW = 1, 2        # the kernels' scale_modes bits


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
        return targets.nvidia_arch(target) >= (89 if fp8 else 80)
    return target.startswith(("gfx90a", "gfx94", "gfx95"))


def has_epilogue_path(target: str, fp8: bool) -> bool:
    """Where skinny_gemm_kernel runs at all (the fused epilogues live only there and in the stream kernel):
    the matrix path, and gfx90a's FP8 (widened to f16 in registers; the plain GEMM prefers gemv.hip there)."""
    return has_matrix_path(target, fp8) or target.startswith("gfx90a")


def _kernel(src: str, name: str, defines: tuple = ()):
    return C.module(src, defines)[name]


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
    if _is_fp8(dtype):
        return "unsigned char"
    return {torch.bfloat16: "__hip_bfloat16", torch.float16: "__half", torch.float32: "float"}[dtype]


# The kernels' epilogue types (template argument EP of skinny_gemm.hip's kernels)
EP_STORE, EP_RESIDUAL = "skinny::ep_store", "skinny::ep_residual"


def ep_swiglu(fmt: str | None) -> str:
    """SwiGLU epilogue over interleaved gate/up rows: fp16/bf16/fp32 out (fmt None) or FP8 of that format."""
    return f"skinny::ep_swiglu<{'skinny::no_quant' if fmt is None else C.fp8_tag(fmt)}>"


def _is_fp8(dtype) -> bool:
    import torch
    return dtype in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e4m3fnuz", None))


# ----------------------------------------------------------------------------- configs
# (MT, WARPS_K, UNROLL) that won a sweep somewhere (H100: (1, 4, 2) at 28672 x 4096 FP8 and 13312 x 16384 bf16)
_MMA_SHAPES = ((1, 8, 2), (2, 4, 2), (2, 8, 2), (1, 4, 4), (1, 4, 2))
_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)
# Above 8 activation rows (2+ activation tiles) on NVIDIA, (MT, WARPS_K, UNROLL) = (1, 4, 2) is also built with
# launch bounds of 4 blocks per SM (MINB), which ptxas schedules into <= 128 registers with no spills. On an H100 it
# ran FP8 13312 x 16384 at M = 32 in 90.3 us against 96.7 for the best config without it, and 16384 x 6656 in 45.7
# against 55.7 (cuBLASLt 79.0 / 41.9): the plain build keeps fewer loads in flight. At M = 16 it also won: 76.1
# against 77.6 (13312 x 16384, split 3) and 40.1 against 40.3 (16384 x 6656), cuBLASLt 77.3 / 40.8 in the same run.
# At M = 32 what remains is the matrix instructions' own time: with the mma.sync calls replaced by one integer op
# (a diagnostic build) the best config ran 13312 x 16384 in 79.2 us against 92.1, cuBLASLt 79.5.
WIDE_MINB, WIDE_MINB_SHAPE, WIDE_MINB_ROWS = 4, (1, 4, 2), 8

# Software pipelining ("pipe": the next step's loads in flight while a step multiplies, twice the load registers).
# On an H100 (FP8, weights rotated beyond L2, M = 1 and 8) it won by 0.5 - 2% alone (13312 x 16384: 72.8 against
# 73.4 us; 16384 x 6656 at M = 8: 37.5 against 38.1) and took the seed's fused decode MLP chain from 124.4 to 121.5 us
# at M = 1 (126.6 against 127.7 at M = 8); from 16 activation rows on it lost or tied, and with 2 x 4 tiles it spills.
PIPE_MAX_ROWS, PIPE_MAX_SPLITS = 8, 4

# The weight loads' L2 policy (SKINNY_W_HINT in skinny_gemm.hip, rocjit/stream.h). The kernel's default, 4
# (256-byte L2 prefetch, evict-first), is the one that holds its speed inside a model: on an H100, after a cuBLAS
# GEMM in the same stream, hint 2 (the same prefetch, default policy) ran 20-32% slower at every weight of 50 MB or
# more (bf16 28672 x 4096: 112 us against 80), while hint 4 ran as fast as alone. Alone, at weights smaller than
# the L2, hint 2 could still win (FP8 2304 x 16384: 18.7 us against 20.9; both ~20 us after cuBLAS), so there the
# tuner also times it (config key "hint").
SMALL_WEIGHT_BYTES = 48 << 20
ALT_HINT = 2


def hint_defines(cfg: dict) -> tuple:
    """The compile-time defines of a config's weight-load hint (none for the kernel's default)."""
    h = cfg.get("hint")
    return (("SKINNY_W_HINT", str(int(h))),) if h is not None else ()


def _grid_splits(M: int, N: int, K: int, sms: int, elem_bytes: int, blocks: int, steps: int) -> list[int]:
    """Grid split-K counts worth timing for a kernel of `blocks` row tiles whose K range holds `steps` whole rounds
    of its block (one step for every warp or warpgroup splitting K inside it): at most 24 blocks per
    multiprocessor, at least one round per split, and fp32 partials (splits * M * N * 8 bytes of traffic) of at
    most a tenth of the weight bytes."""
    return [s for s in _SPLITS
            if s == 1 or (blocks * s <= 24 * sms and steps >= s and s * M * N * 8 <= 0.1 * N * K * elem_bytes)]


def mma_candidates(M: int, N: int, K: int, sms: int, elem_bytes: int = 2, target: str = "") -> list[dict]:
    """Matrix-core configs worth timing: rows per warp (MT tiles of 16), warps splitting K in a block,
    k-blocks in flight, and grid split-K (fills the GPU at small N and evens out the last wave; the
    fp32 partials cost splits * M * N * 8 bytes of traffic). On NVIDIA, weights smaller than
    SMALL_WEIGHT_BYTES are also tried with the ALT_HINT load policy."""
    nkb = -(-K * elem_bytes // 64)                      # 64-byte k-blocks per row
    out = [{"path": "mma", "mt": mt, "warps_k": wk, "unroll": un, "splits": splits}
           for mt, wk, un in _MMA_SHAPES
           for splits in _grid_splits(M, N, K, sms, elem_bytes, -(-N // (16 * mt)), nkb // (wk * un))]
    if M <= PIPE_MAX_ROWS:
        out += [dict(c, pipe=1) for c in out if c["splits"] <= PIPE_MAX_SPLITS]
    if target.startswith("sm_") and M > WIDE_MINB_ROWS:
        out += [dict(c, minb=WIDE_MINB) for c in out if (c["mt"], c["warps_k"], c["unroll"]) == WIDE_MINB_SHAPE]
    if target.startswith("sm_") and N * K * elem_bytes < SMALL_WEIGHT_BYTES:
        out += [dict(c, hint=ALT_HINT) for c in out]
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
# above 16 activation rows: 256 weight rows per tile (activation bytes staged per weight byte: 1/8 at M = 32);
# MT 2 x CW 8 spills at its 384 threads, MT 4 x CW 4 fits in 255 registers
_STREAM_SHAPES_WIDE = ((4, 4, 128, 4),)
_STREAM_SMEM = 227 * 1024 - 2048            # H100 opt-in shared memory per block, less static + barriers


def has_stream_path(target: str) -> bool:
    """The streamed kernel's mbarrier waits (try_wait.parity) need sm_90 (Hopper) or newer."""
    return target.startswith("sm_") and targets.nvidia_arch(target) >= 90


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
    for mt, cw, bk, pw in _STREAM_SHAPES + (_STREAM_SHAPES_WIDE if M > 16 else ()):
        if bk > 2 * K * elem_bytes and bk > 256:        # chunks mostly past the end of short rows
            continue
        if M > 16 and mt * cw < 8:                      # 32 activation rows per 64 weight rows: too much L2 traffic
            continue
        cfg = {"path": "stream", "mt": mt, "cw": cw, "bk": bk, "pw": pw, "cps": 1}
        if stream_stages(M, cfg) >= 3:
            out.append(cfg)
    return out


# (SLABS, WG, KB) of skinny_tma_kernel: 64 * SLABS * WG weight rows per tile, WG multiplying warpgroups, KB
# 128-byte boxes of K per chunk. It is a tuner candidate above 4 activation rows (ROCJIT_SKINNY_TMA=0 leaves it
# out). What held it back was its epilogue, not its weight stream: TMA alone (no math) streams 13312 x 16384 at
# 3.9 - 4.19 TB/s on an H200 (93 - 99% of copy) for every box shape, ring depth and block count tried, and the
# kernel with its fix-up and epilogue left out ran 53.5 us at M = 32 (cuBLASLt: 54 - 60). Its epilogue loaded the
# tile's scales after the main loop, under the full weight stream (6.5 us); they now ride in the stage that ends a
# segment. H200, FP8, weights rotated beyond L2, M = 32: 13312 x 16384 63.6 us against 76.9 for the best other
# config (cuBLASLt 59.3), 16384 x 6656 38.5 against 40.1 (cuBLASLt 28.3); slower at 2304 x 16384 (21.5 against
# 17.8) and at M <= 16 (61 against 57.9 at M = 16). Of the remaining gap to the bare stream, the stream-K fix-up
# (~1 - 5 us) goes where whole_tile_grid applies; the stores' ~5 us is where they sit (the kernel's tail), not their
# width: staged through shared memory into 16-byte runs they ran the same (16384 x 6656: 34.0 against 32.7 us).
# The activations now come by TMA as well (they came by cp.async, 16 bytes a lane, with a proxy fence per stage in
# every multiplying warpgroup): outputs bit-identical, H200, M = 32, alternating rounds, best config each: bf16
# 16384 x 6656 60.4 -> 56.8 us, 13312 x 16384 120.0 -> 115.3, 2304 x 16384 29.2 -> 27.2 (one warpgroup, 1.18x);
# FP8 2304 x 16384 18.8 -> 16.9, 16384 x 6656 31.6 -> 31.0, 13312 x 16384 unchanged (61.6 / 62.1); configs of one
# multiplying warpgroup gained 7 - 37% everywhere. The weights' copies carry an L2 evict-first policy (a config's
# "hint" 3 or 4, the default; others none): FP8 13312 x 16384 61.3 -> 59.1 us, 2304 x 16384 17.2 -> 16.7.
# With its activations by TMA it also serves 5 - 16 rows (boxes of 8 / 16; the tuner's timings, H200, graph replays,
# weights rotated beyond L2, against the best other config): FP8 16384 x 6656 M = 8 27.4 against 28.2 us, M = 16 27.8
# against 28.9; bf16 M = 16 54.1 against 55.2. There it lets the next kernel in only at exit: with the early trigger
# it keeps at 32 rows, the seed's fused MLP chain (rms_norm, gate/up on skinny_gemm_kernel, down on this kernel) took
# 133.6 / 128.5 us at M = 8 / 16 against 92.6 / 94.6 with the down projection on skinny_gemm_kernel (the gate/up
# blocks let in early were packed onto the SMs that emptied first; see the kernel), and 88.8 / 90.6 with the trigger
# at exit (H200, one loan). Split-K (tma_splits) where few tiles leave multiprocessors idle: FP8
# 2304 x 16384 M = 32 16.4 against 16.8 (cuBLASLt 15.5 - 15.6).
# Finer rings lost: one box per stage, 8 - 12 stages, was 18 - 26% slower at M = 32 (FP8 16384 x 6656 35.4 against
# 28.8 us, 13312 x 16384 69.6 against 60.3; bf16 16384 x 6656 72.4 against 57.2).
# The stream-K fix-up's round trips (partials stored, fence, ticket, partials loaded) cost FP8 13312 x 16384 3.4 us
# at M = 32 (60.2 against 56.8 with the fix-up skipped, wrong sums) and 4.3 at M = 16 (cuBLASLt 55.1 - 55.5). Tried
# and not kept: polling the tile's ticket each chunk and copying the other block's partials into shared memory as
# soon as they were out, so that the last block sums without a round trip -- bit-identical, and 1 - 12% slower;
# polled only two and three chunks before the segment's end, 1.3 - 1.5 us faster at M = 8 / 16 and bf16 M = 32,
# equal at FP8 M = 32 (the other block is often not done by then), and still behind the mma.sync kernel at M = 8.
# Where many blocks share a tile the fix-up costs most (2304 x 16384: 7 - 9 blocks a tile): there the stream-K
# schedule can instead write each block's raw sums and leave them to skinny_streamk_reduce (cfg "reduce"; the same
# sums in the same order, bit-identical). H200, two warpgroups: bf16 2304 x 16384 M = 32 25.6 us against 28.7 with
# the fix-up (26.6 the best fix-up config; torch.matmul 25.1; at M = 16 23.2 against 26.9); FP8 M = 32 17.0 against
# 20.1 (split-K 16.3 stays ahead); slower where tiles are shared by two blocks (FP8 13312 x 16384 M = 32 61.4 against
# 59.0).
_TMA_SHAPES = ((1, 1, 4), (1, 2, 4), (1, 1, 8), (1, 2, 2))
_TMA_SMEM = 227 * 1024 - 1024 - 128          # opt-in shared memory, less the alignment slack and the barriers
TMA_BOX_ROWS = 32                            # SKINNY_TMA_BOX_ROWS in skinny_gemm.hip


def has_tma_path(target: str) -> bool:
    """skinny_tma_kernel needs sm_90a's wgmma and the Tensor Memory Accelerator."""
    return target == "sm_90a"


def tma_rows(M: int) -> int:
    """Activation rows the wgmma kernels (skinny_tma_kernel, skinny_wgmma_kernel) keep per step, their wgmma N: 8,
    16 or 32."""
    return 8 if M <= 8 else 16 if M <= 16 else 32


def tma_stage_bytes(M: int, cfg: dict) -> int:
    """Shared memory of one skinny_tma_kernel stage: KB boxes of its weight and activation rows, and their scales."""
    rows = 64 * cfg["slabs"] * cfg["wg"] + tma_rows(M)
    return cfg["kb"] * 128 * rows + 4 * rows


def tma_stages(M: int, cfg: dict) -> int:
    return min(8, _TMA_SMEM // tma_stage_bytes(M, cfg))


def tma_enabled() -> bool:
    """Whether the tuner also times skinny_tma_kernel (see _TMA_SHAPES): unless ROCJIT_SKINNY_TMA=0. Its tensor map
    (a by-value launch argument encoded for the weight's address) is made again by each eager replay for the call's
    weight (Call.derive), so its eager calls take the op's plan like the other paths."""
    return os.environ.get("ROCJIT_SKINNY_TMA", "1") != "0"


def tma_candidates(M: int, N: int, K: int, sms: int, elem_bytes: int = 2) -> list[dict]:
    """skinny_tma_kernel configs (see _TMA_SHAPES), for M > 4 (none below)."""
    if M <= 4:
        return []
    out = []
    for slabs, wg, kb in _TMA_SHAPES:
        if kb > 1 and kb * 128 > 2 * K * elem_bytes:     # chunks mostly past the end of short rows
            continue
        cfg = {"path": "tma", "slabs": slabs, "wg": wg, "kb": kb}
        if tma_stages(M, cfg) >= 2:
            out.append(cfg)
            tiles = -(-N // (64 * slabs * wg))
            blocks = whole_tile_grid(tiles, sms)
            if blocks:
                out.append(dict(cfg, blocks=blocks))
            if tiles % sms:                             # tiles shared between blocks: the fix-up or the reduce kernel
                out.append(dict(cfg, reduce=1))
            out += [dict(cfg, splits=s) for s in tma_splits(M, N, K, sms, elem_bytes, tiles, kb)]
    return out


def tma_splits(M: int, N: int, K: int, sms: int, elem_bytes: int, tiles: int, kb: int) -> list[int]:
    """Split-K counts of skinny_tma_kernel for products of few tiles (cuBLASLt runs FP8 2304 x 16384 at M = 32 as 36
    tiles of 64 rows split 3 ways, then a reduction): one wave of (tile, split) blocks, at least two chunks per split,
    and fp32 partials (splits * M * N * 8 bytes of traffic) of at most a tenth of the weight bytes."""
    nk = -(-K * elem_bytes // (kb * 128))
    return [s for s in (2, 3, 4, 6, 8) if tiles * s <= sms and 2 * s <= nk and s * M * N * 8 <= 0.1 * N * K * elem_bytes]


def whole_tile_grid(tiles: int, sms: int) -> int | None:
    """A grid below the multiprocessor count (down to 3/4 of it) that gives every block the same number of whole
    tiles, so that no tile is split between blocks (no stream-K fix-up), or None. H200, FP8, M = 32, 1 x 2 x 4
    tile: 16384 x 6656 (128 tiles) 34.4 us on 128 blocks against 38.9 on 132; 28672 x 4096 (224 tiles) 39.3 on 112
    against 41.3; bf16 16384 x 6656 63.5 against 67.3; slower at 13312 x 16384 (104 tiles: 69.4 against 65.2)."""
    for g in range(sms - 1, -(-3 * sms // 4) - 1, -1):
        if tiles % g == 0:
            return g
    return None


# (SLABS, WG, KB) of skinny_wgmma_kernel: 64 * SLABS weight rows per warpgroup, WG warpgroups splitting K in a
# block, KB 128-byte boxes of K per step (at 32 activation rows, 2 warpgroups with 2 slabs or KB 2 are left out:
# over 200 registers). The path is timed only with ROCJIT_SKINNY_WGMMA=1: on an H100 (FP8, weights rotated beyond
# L2, one run) its best config lost to skinny_gemm_kernel's at every shape tried. 13312 x 16384: M = 32 93.4 us
# against 91.4 (cuBLASLt 81.6), M = 16 83.8 against 76.1 (77.2); 16384 x 6656: M = 32 49.8 against 46.1 (41.6),
# M = 16 45.7 against 40.0 (40.8). It streams 2.3 - 2.6 TB/s: a warpgroup keeps one step of weights in flight while
# it multiplies (a third register set costs an occupancy step), where skinny_gemm_kernel's independent warps keep
# more bytes in flight.
_WGMMA_SHAPES = ((1, 1, 1), (1, 2, 1), (1, 1, 2), (2, 1, 1))
WGMMA_MIN_ROWS = 9


def wgmma_enabled() -> bool:
    """Whether the tuner also times skinny_wgmma_kernel (ROCJIT_SKINNY_WGMMA=1; see _WGMMA_SHAPES)."""
    return os.environ.get("ROCJIT_SKINNY_WGMMA", "0") == "1"


def has_wgmma_path(target: str) -> bool:
    """skinny_wgmma_kernel needs sm_90a's warpgroup MMA."""
    return target == "sm_90a"


def wgmma_candidates(M: int, N: int, K: int, sms: int, elem_bytes: int = 2) -> list[dict]:
    """skinny_wgmma_kernel configs for WGMMA_MIN_ROWS..32 activation rows (none below), with grid split-K as for
    mma_candidates."""
    if M < WGMMA_MIN_ROWS:
        return []
    return [{"path": "wgmma", "slabs": slabs, "wg": wg, "kb": kb, "splits": splits}
            for slabs, wg, kb in _WGMMA_SHAPES if not (M > 16 and wg > 1 and (kb > 1 or slabs > 1))
            for splits in _grid_splits(M, N, K, sms, elem_bytes, -(-N // (64 * slabs)),
                                       -(-K * elem_bytes // (128 * kb)) // wg)]


def matrix_candidates(M: int, N: int, K: int, sms: int, elem_bytes: int, target: str) -> list[dict]:
    """Every matrix-core config the skinny GEMMs' tuner times on `target`: the enabled Hopper paths (TMA, wgmma),
    the stream kernel's (sm_90+; the operands are 16-byte aligned, see aligned_operands), then the mma kernel's."""
    cands = mma_candidates(M, N, K, sms, elem_bytes, target)
    if has_stream_path(target):
        cands = stream_candidates(M, N, K, sms, elem_bytes) + cands
    if has_wgmma_path(target) and wgmma_enabled():
        cands = wgmma_candidates(M, N, K, sms, elem_bytes) + cands
    if has_tma_path(target) and tma_enabled():
        cands = tma_candidates(M, N, K, sms, elem_bytes) + cands
    return cands


def portable_candidates(M: int) -> list[dict]:
    return [{"path": "portable", "p": p, "rows": r, "unroll": u}
            for p, r, u in ((32, 4, 2), (16, 8, 2), (8, 16, 2))]


# gemv.hip's kernel as a skinny GEMM on NVIDIA for a few activation rows: teams of lanes reading 256 - 512 contiguous
# bytes of a row per load stream the weights faster than the matrix-core kernels' 64-byte row pieces (H200, weights
# rotated, graph replays, M = 1: FP8 16384 x 6656 26.2 - 26.6 against 28.5 - 28.8 us, 13312 x 16384 53.5 - 54.4
# against 56.0 - 57.2; bf16 49.5 - 50.1 against 55.2 - 55.4 and 99.2 - 103.0 against 107.1 - 108.3). Its fp32
# multiplies grow with M: at M = 4 it lost everywhere (FP8 16384 x 6656 53 - 63 us, bf16 66 - 73, against 28 and 53).
PORTABLE_SKINNY_ROWS = 2


def skinny_candidates(M: int, N: int, K: int, sms: int, elem_bytes: int, target: str, ep: str = EP_STORE) -> list[dict]:
    """What skinny_gemm and its fused ops (epilogue ep) tune on a target with a matrix path: the matrix-core kernels'
    configs, then the portable kernel's."""
    swiglu = ep not in (EP_STORE, EP_RESIDUAL)
    return matrix_candidates(M, N, K, sms, elem_bytes, target) + portable_skinny_candidates(M, target, swiglu)


def portable_skinny_candidates(M: int, target: str, swiglu: bool = False) -> list[dict]:
    """The portable kernel's configs (p lanes per team, rows teams per block, unroll, rt rows per team) that
    skinny_gemm and its fused ops time beside the matrix-core kernels; SwiGLU needs whole 16-row gate / up groups
    per block (rows * rt % 16 == 0)."""
    if not target.startswith("sm_") or M > PORTABLE_SKINNY_ROWS:
        return []
    return [{"path": "portable", "p": p, "rows": r, "unroll": u, "rt": rt}
            for p, r, u, rt in ((32, 4, 2, 2), (32, 4, 1, 4), (16, 8, 2, 2), (16, 16, 2, 1), (32, 8, 2, 1),
                                (32, 4, 4, 1), (32, 8, 1, 4))
            if not swiglu or r * rt % 16 == 0]


def _m_tiles(M: int, target: str) -> int:
    rows = 8 if target.startswith("sm_") else 16       # activation rows per matrix instruction
    return -(-M // rows)


def _mb(M: int) -> int:
    return 1 if M <= 1 else 2 if M <= 2 else 4 if M <= 4 else 8 if M <= 8 else 16 if M <= 16 else 32


# ----------------------------------------------------------------------------- launches
def scale_modes(M: int, N: int, scale_a, scale_w) -> int:
    """The kernels' scale_modes: scale_w per output column when it has N > 1 elements, scale_a per row when M > 1."""
    return (SCALE_W_PER_COLUMN if scale_w is not None and scale_w.numel() > 1 else 0) | \
        (SCALE_A_PER_ROW if scale_a is not None and scale_a.numel() > 1 else 0)


def launch_mma(a, w, out, scale_a, scale_w, M: int, N: int, K: int, cfg: dict, target: str, wave: int,
               call=UNRECORDED, *, ep: str = EP_STORE, residual=None, out_scale=None):
    """C = A W^T (* scales) with skinny_gemm_kernel; split-K partials reduced by skinny_splitk_reduce, which then
    runs the epilogue `ep` (EP_STORE, EP_RESIDUAL with `residual`, ep_swiglu(fmt) with `out_scale` for FP8)."""
    nt = _m_tiles(M, target)
    mt, wk, un, splits = cfg["mt"], cfg["warps_k"], cfg["unroll"], cfg["splits"]
    per16 = 16 // a.element_size()
    nkb = -(-K // (4 * per16))
    kb_per_split = -(-nkb // splits)
    splits = -(-nkb // kb_per_split)
    minb = cfg.get("minb", 0) if target.startswith("sm_") else 0
    pipe = int(bool(cfg.get("pipe")))
    name = f"skinny_gemm_kernel<{_elem_kind(a.dtype)}, {ctype(out.dtype)}, {mt}, {nt}, {wk}, {un}, {minb}, {pipe}, {ep}>"
    return _launch_split_k(_kernel(SRC, name, hint_defines(cfg)), (-(-N // (16 * mt)), splits), wk * wave, a, w,
                           out, scale_a, scale_w, M, N, K, kb_per_split, call, ep, residual, out_scale)


def _launch_split_k(k, grid, block, a, w, out, scale_a, scale_w, M, N, K, per_split, call, ep, residual, out_scale):
    """Launches a skinny kernel of grid (row tiles, splits) (the launch signature of skinny_gemm_kernel and
    skinny_wgmma_kernel); with more than one split, its fp32 partials and skinny_splitk_reduce, which then runs the
    epilogue."""
    modes = scale_modes(M, N, scale_a, scale_w)
    ldo = out.shape[-1]
    splits = grid[1]
    if splits == 1:
        call.launch(k, grid, block, a, w, out, None, residual, out_scale, scale_a, scale_w, modes, M, N, K,
                    per_split, ldo)
        return out
    # the fp32 partials go to the current stream's workspace (launches on one stream never overlap), so a
    # replayed split-K call allocates its output alone
    partial = call.const(_stream_workspace(a.device, splits * M * N))
    call.bind_stream()
    call.launch(k, grid, block, a, w, out, partial, residual, out_scale, scale_a, scale_w, modes, M, N, K,
                per_split, ldo)
    _launch_reduce(call, "skinny_splitk_reduce", ep, partial, out, residual, out_scale, scale_a, scale_w, modes, M, N,
                   splits, ldo)
    return out


def _launch_reduce(call, kernel: str, ep: str, partial, out, residual, out_scale, scale_a, scale_w, modes: int, M: int,
                   N: int, *tail):
    """A reduce kernel of skinny_gemm.hip (skinny_splitk_reduce, skinny_streamk_reduce: the partials' slabs summed,
    then the epilogue `ep`), one thread per output of out's M x ldo result; tail: its arguments after N."""
    call.launch(_kernel(SRC, f"{kernel}<{ctype(out.dtype)}, {ep}>"), -(-(M * out.shape[-1]) // 256), 256, partial, out,
                residual, out_scale, scale_a, scale_w, modes, M, N, *tail)


def launch_wgmma(a, w, out, scale_a, scale_w, M: int, N: int, K: int, cfg: dict, call=UNRECORDED, *,
                 ep: str = EP_STORE, residual=None, out_scale=None):
    """C = A W^T (* scales) with skinny_wgmma_kernel (sm_90a; see wgmma_candidates), epilogues as launch_mma."""
    slabs, wg, kb = cfg["slabs"], cfg["wg"], cfg["kb"]
    nsteps = -(-K * a.element_size() // (128 * kb))
    per_split = -(-nsteps // cfg["splits"])
    name = (f"skinny_wgmma_kernel<{_elem_kind(a.dtype)}, {ctype(out.dtype)}, {tma_rows(M)}, {slabs}, {wg}, {kb}, "
            f"{ep}>")
    return _launch_split_k(_kernel(SRC, name, hint_defines(cfg)), (-(-N // (64 * slabs)), -(-nsteps // per_split)),
                           128 * wg, a, w, out, scale_a, scale_w, M, N, K, per_split, call, ep, residual, out_scale)


_stream_state: dict = {}
_capture_tickets: dict = {}          # device index -> [zeroed int32 pool, next free slot] for captured launches
_graph_tickets: list = []            # every such pool: graphs hold their slices' addresses, never the tensors
_retired: list = []                  # outgrown per-stream buffers (queued kernels may use them), kept (< the new)
_capture_lock = threading.Lock()


_TICKET_SLOT = 64                    # ints per slice of the capture pool (256 bytes)
_TICKET_POOL = 1 << 16               # ints per capture pool (256 KB)


def _tickets_for_capture(device, tiles: int):
    """Zeroed tickets of their own for a launch being captured (a graph may replay beside the stream's own
    launches), cut from a pool made beside the capture (C.persistent_zeros) and kept for good."""
    import torch
    need = -(-max(tiles, 1) // _TICKET_SLOT) * _TICKET_SLOT
    with _capture_lock:               # threads capturing at once never share a slice
        pool = _capture_tickets.get(device.index)
        if pool is None or pool[1] + need > pool[0].numel():
            pool = [C.persistent_zeros(max(need, _TICKET_POOL), torch.int32, device), 0]
            _capture_tickets[device.index] = pool
            _graph_tickets.append(pool[0])
        t = pool[0][pool[1]:pool[1] + need]
        pool[1] += need
    return t


def _stream_slot(device) -> list:
    """[tickets, workspace] kept for the current stream of `device` (entries None until first needed)."""
    import torch
    return _stream_state.setdefault((device.index, torch.cuda.current_stream(device).cuda_stream), [None, None])


def _slot_buffer(state: list, i: int, n: int, grow: int, dtype, device):
    """state[i] when it holds n elements, else a new zeroed buffer of `grow` (>= n) elements put there; the one it
    replaces is kept for good (launches queued on the stream may still use it) and never handed out again."""
    if state[i] is None or state[i].numel() < n:
        if state[i] is not None:
            _retired.append(state[i])
        state[i] = C.persistent_zeros(grow, dtype, device)
    return state[i]


def _stream_workspace(device, floats: int):
    """fp32 scratch of the current stream, kept from call to call (launches on one stream never use it at the same
    time): the stream kernel's fix-up partials, the split-K kernels' partials. A graph being captured gets a
    workspace of its own."""
    import torch
    if torch.cuda.is_current_stream_capturing():
        return torch.empty(floats, dtype=torch.float32, device=device)
    state = _stream_slot(device)
    grow = max(floats, 2 * (state[1].numel() if state[1] is not None else 0))
    return _slot_buffer(state, 1, floats, grow, torch.float32, device)


def _stream_buffers(device, tiles: int, ws_floats: int):
    """(tickets, workspace) of the stream kernel for the current stream, kept from call to call: per-tile tickets
    that the kernel resets after use (so they stay zero between launches and graph replays) and the fp32 partials
    of its fix-up (_stream_workspace). A launch being captured takes tickets of its own, zeroed beside the capture
    (_tickets_for_capture: no fill in the graph), and a workspace of its own (from the graph's pool: no fill)."""
    import torch
    if torch.cuda.is_current_stream_capturing():
        return _tickets_for_capture(device, tiles), _stream_workspace(device, ws_floats)
    size = max(tiles, 4096)
    tickets = _slot_buffer(_stream_slot(device), 0, size, size, torch.int32, device)
    return tickets, _stream_workspace(device, ws_floats)


def launch_stream(a, w, out, scale_a, scale_w, M: int, N: int, K: int, cfg: dict, sms: int, call=UNRECORDED, *,
                  ep: str = EP_STORE, residual=None, out_scale=None):
    """C = A W^T (* scales) with skinny_stream_kernel: one launch, stream-K, fixed-order fix-up; the block that
    writes a tile runs the epilogue `ep` (see launch_mma). Its tickets and workspace belong to the current stream,
    so a plan recorded here replays on that stream only."""
    nt = -(-M // 8)
    mt, cw, bk, pw, cps = cfg["mt"], cfg["cw"], cfg["bk"], cfg["pw"], cfg["cps"]
    stages = cfg.get("stages") or stream_stages(M, cfg)
    rows = 16 * mt * cw
    tiles = -(-N // rows)
    total = tiles * -(-K * a.element_size() // bk)
    grid = max(1, min(sms * cps, total))
    tickets, ws = _stream_buffers(a.device, tiles, grid * 2 * cw * 32 * mt * nt * 4)
    smem = stages * (rows + 8 * nt) * (bk + 16) + 16 * stages
    name = (f"skinny_stream_kernel<{_elem_kind(a.dtype)}, {ctype(out.dtype)}, {mt}, {nt}, {cw}, {bk}, {stages}, "
            f"{pw}, {ep}>")
    call.const(tickets)
    call.const(ws)
    call.bind_stream()
    call.launch(_kernel(SRC, name), grid, (cw + pw) * 32, a, w, out, ws, tickets, residual, out_scale, scale_a,
                scale_w, scale_modes(M, N, scale_a, scale_w), M, N, K, out.shape[-1], shared_mem=smem)
    return out


def mma_blockwise_candidates(M: int, N: int, K: int, sms: int, target: str) -> list[dict]:
    """skinny_gemm_blockwise_kernel configs (FP8, M <= 32): skinny_gemm_kernel's, less the 4-blocks-per-SM launch
    bounds (its 128 registers spill the blockwise partials at 4 activation tiles) and the pipelined twins (its body
    has no second register set)."""
    return [c for c in mma_candidates(M, N, K, sms, 1, target) if "minb" not in c and "pipe" not in c]


def launch_mma_blockwise(a, w, out, sa, sw, M: int, N: int, K: int, cfg: dict, target: str, wave: int,
                         call=UNRECORDED):
    """C = A W^T with blockwise FP8 scales (skinny_gemm_blockwise_kernel): a [M, K] and w [N, K] FP8 (or their
    uint8 views) with rows K bytes apart, K % 16 == 0; sa / sw (tensor, stride of a row, stride of a 128-wide K
    block), sa per row of a, sw per 128 rows of w; out [M, N] contiguous. Grid split-K in whole 128-wide K blocks;
    its scaled partials summed by skinny_splitk_reduce."""
    nt = _m_tiles(M, target)
    mt, wk, un, splits = cfg["mt"], cfg["warps_k"], cfg["unroll"], cfg["splits"]
    nkb = -(-K // 64)
    kb_per_split = -(-nkb // splits)
    kb_per_split += kb_per_split % 2                 # splits start on a 128-wide K block
    splits = -(-nkb // kb_per_split)
    ldo = out.shape[-1]
    name = f"skinny_gemm_blockwise_kernel<{ctype(out.dtype)}, {mt}, {nt}, {wk}, {un}, 0>"
    grid = (-(-N // (16 * mt)), splits)
    k = _kernel(SRC, name, hint_defines(cfg))
    scales = (sa[0], sw[0], M, N, K, kb_per_split, ldo, sa[1], sa[2], sw[1], sw[2])
    if splits == 1:
        call.launch(k, grid, wk * wave, a, w, out, None, *scales)
        return out
    partial = call.const(_stream_workspace(a.device, splits * M * N))
    call.bind_stream()
    call.launch(k, grid, wk * wave, a, w, out, partial, *scales)
    _launch_reduce(call, "skinny_splitk_reduce", EP_STORE, partial, out, None, None, None, None, 0, M, N, splits, ldo)
    return out


def launch_tma(a, w, out, scale_a, scale_w, M: int, N: int, K: int, cfg: dict, sms: int, call=UNRECORDED, *,
               ep: str = EP_STORE, residual=None, out_scale=None):
    """C = A W^T (* scales) with skinny_tma_kernel (sm_90a): the stream kernel's schedule and fix-up, the weights
    copied by TMA through a tensor map of w, multiplied by wgmma. The tensor map is a by-value launch argument
    encoded for w's address: an eager plan makes it again for each call's w (Call.derive). cfg["splits"] >= 2: one
    block per (tile, split), raw sums to the stream's workspace, skinny_splitk_reduce after it (no fix-up).
    cfg["reduce"]: stream-K with each block's raw sums in the workspace, skinny_streamk_reduce after it (no fix-up)."""
    nb = tma_rows(M)
    slabs, wg, kb = cfg["slabs"], cfg["wg"], cfg["kb"]
    stages = cfg.get("stages") or tma_stages(M, cfg)
    rows = 64 * slabs * wg
    kbytes = K * a.element_size()
    tiles = -(-N // rows)
    nk = -(-kbytes // (kb * 128))
    splits = min(cfg.get("splits", 1), nk)
    reduce = splits <= 1 and bool(cfg.get("reduce"))
    if splits > 1:
        grid = tiles * splits
        ws_floats = splits * M * N                    # each split's raw sums, [splits, M, N]
    else:
        grid = max(1, min(cfg.get("blocks") or sms, tiles * nk))
        # the fix-up's two slots per block of slabs * nb / 2 floats for each of its wg * 128 multiplying threads;
        # with the reduce kernel a slab of [M, N] raw sums for each of the most blocks a tile is shared by
        ws_floats = streamk_slabs(tiles * nk, nk, grid) * M * N if reduce else grid * 2 * (wg * 128) * (slabs * nb // 2)
    tickets, ws = _stream_buffers(a.device, tiles, ws_floats)
    tmap = call.derive(tensor_map_fn(kbytes, N, kbytes, TMA_BOX_ROWS), w)
    amap = call.derive(tensor_map_fn(kbytes, M, kbytes, nb), a)     # boxes of nb rows: rows past M read as zeros
    name = f"skinny_tma_kernel<{_elem_kind(a.dtype)}, {ctype(out.dtype)}, {nb}, {slabs}, {wg}, {kb}, {stages}, {ep}>"
    call.const(tickets)
    call.const(ws)
    call.bind_stream()
    modes, ldo = scale_modes(M, N, scale_a, scale_w), out.shape[-1]
    call.launch(_kernel(SRC, name, hint_defines(cfg)), grid, (wg + 1) * 128, tmap, amap, a, out, ws, tickets, residual,
                out_scale, scale_a, scale_w, modes, M, N, K, ldo, splits if splits > 1 else -1 if reduce else 0,
                shared_mem=1024 + stages * tma_stage_bytes(M, cfg) + 16 * stages)
    if splits > 1:
        _launch_reduce(call, "skinny_splitk_reduce", ep, ws, out, residual, out_scale, scale_a, scale_w, modes, M, N,
                       splits, ldo)
    elif reduce:
        _launch_reduce(call, "skinny_streamk_reduce", ep, ws, out, residual, out_scale, scale_a, scale_w, modes, M, N,
                       ldo, rows, nk, grid)
    return out


def streamk_slabs(total: int, nk: int, blocks: int) -> int:
    """The most blocks that share one tile of nk chunks when `total` chunks are cut into `blocks` ranges as the
    stream-K kernels cut them (block b: chunks b * total // blocks onwards): a tile's chunks t * nk .. t * nk + nk - 1
    belong to blocks range_owner(first) .. range_owner(last), owner(f) = ((f + 1) * blocks - 1) // total."""
    owner = lambda f: ((f + 1) * blocks - 1) // total        # noqa: E731
    return max(owner(t + nk - 1) - owner(t) + 1 for t in range(0, total, nk))


@functools.lru_cache(maxsize=256)
def tensor_map_fn(kbytes: int, rows: int, ld: int, box_rows: int):
    """address -> the tensor map of a K-major operand at `address` (`rows` rows of `kbytes` bytes, `ld` bytes apart;
    boxes of box_rows x 128 bytes, as skinny_tma_kernel and gemm_fp8_blockwise's TMA kernel copy them): the function
    an eager plan calls on every replay (Call.derive), with the encoder bound here rather than imported per call.
    One function per geometry, remembering the maps of its last 64 addresses: a map describes only an address and a
    geometry, and a decode step's activations come back to the same few addresses (the caching allocator)."""
    from rocjit.platform import cuda
    encode = cuda.tensor_map_2d
    return functools.lru_cache(maxsize=64)(lambda address: encode(address, kbytes, rows, ld, 128, box_rows))


# gemv.hip's weight kinds (its template argument WK), by the ops' names for them
GEMV_WEIGHT_KINDS = {"f16": "gemv::w_f16", "bf16": "gemv::w_bf16", "i8": "gemv::w_i8", "i4": "gemv::w_i4",
                     "e4m3": "gemv::w_e4m3", "e4m3fnuz": "gemv::w_e4m3fnuz"}


def launch_portable(x, xt: str, wk: str, w, out, w_scale, w_zero, group_size: int, modes: int, scale_a,
                    st: str, M: int, N: int, K: int, cfg: dict, call=UNRECORDED, *, ep: str = EP_STORE,
                    residual=None, out_scale=None):
    """gemv.hip's portable kernel: cfg p threads per team, rows (teams) per block, unroll, rt rows per team;
    modes: the scale_modes bits (per-column w_scale, per-row scale_a); ep: skinny_gemm's epilogues (N weight rows,
    out [M, out.shape[-1]]: N, or I for SwiGLU)."""
    p, rows, un, rt = cfg["p"], cfg["rows"], cfg["unroll"], cfg.get("rt", 1)
    name = f"gemv_kernel<{xt}, {wk}, {st}, {ctype(out.dtype)}, {p}, {rows}, {_mb(M)}, {un}, {rt}, {ep}>"
    call.launch(_kernel(GEMV_SRC, name), -(-N // (rows * rt)), p * rows, w, x, out, w_scale, w_zero, group_size,
                modes, scale_a, N, K, M, residual, out_scale, out.shape[-1])
    return out


def launch_skinny_portable(a, w, out, scale_a, scale_w, M: int, N: int, K: int, cfg: dict, call=UNRECORDED, *,
                           ep: str = EP_STORE, residual=None, out_scale=None):
    """skinny_gemm (and its fused epilogues) on gemv.hip's portable kernel: A [M, K] times W [N, K]^T, FP8 with
    skinny_gemm's scales, 16-bit without."""
    fp8 = _is_fp8(a.dtype)
    kind = ("e4m3fnuz" if "fnuz" in str(a.dtype) else "e4m3") if fp8 else "bf16" if "bfloat16" in str(a.dtype) \
        else "f16"
    return launch_portable(a, ctype(a.dtype), GEMV_WEIGHT_KINDS[kind], w, out, scale_w,
                           None, 0, scale_modes(M, N, scale_a, scale_w), scale_a, "float", M, N, K, cfg, call, ep=ep,
                           residual=residual, out_scale=out_scale)


def aligned_operands(op: str, a, w, out=None, call=UNRECORDED):
    """The kernels move 16 bytes at a time: activations whose data pointer is not 16-byte aligned are copied to
    fresh (aligned) memory; a misaligned weight matrix or out= is an error (copying a weight on every call would
    hide a large cost, and out= must be written in place)."""
    for name, t in (("w", w), ("out", out)):
        if t is not None and not C.aligned(t):
            raise ValueError(f"{op}: {name}'s data pointer {t.data_ptr():#x} is not 16-byte aligned (the kernels "
                             f"move 16 bytes at a time); pass an aligned tensor, e.g. {name}.clone()")
    return a if C.aligned(a) else a.clone()


def tuned(op: str, *, bucket: str, dtype: str, device: str, candidates, default, run, w):
    """The tuned (or shipped / built-in default) config; `run(cfg, w)` launches one candidate on weights w (the
    tuner times it over copies of w rotated beyond L2, unrecorded)."""
    copies = []

    def bench(cfg):
        if not copies:
            copies.extend(tune.rotation_copies(w))
        return tune.time_graph([functools.partial(run, cfg, c) for c in copies])

    return tune.pick(op, bucket=bucket, dtype=dtype, device=device, src_hash=src_hash(), candidates=candidates,
                     default=default, bench=bench, simpler=launches)


def launches(cfg: dict) -> int:
    """Kernel launches a config makes: grid split-K or a reduce kernel adds one. Between configs that time alike, the
    tuner takes the one with fewer: inside a model (H100, the seed's fused decode MLP, M = 1..16) a split-K
    gate/up GEMM timed as fast as one launch alone but cost its chain 1.5-3 us, the reduce kernel's boundary."""
    return 2 if cfg.get("splits", 1) > 1 or cfg.get("reduce") else 1


@functools.lru_cache(maxsize=1)
def src_hash() -> str:
    """What this module's tuned configs were measured on: the skinny and GEMV sources and the headers they include."""
    return tune.source_hash(*tune.kernel_sources(SRC, GEMV_SRC))
