"""Blockwise-scaled FP8 GEMM for training (kernels_src/gemm_fp8_blockwise.hip): the DeepSeek-V3 recipe with
1 x 128 scales on the activation / gradient side and 128 x 128 scales on the weight side.

    c = gemm_fp8_blockwise(a, a_scale, b, b_scale)                    # NT (forward): a [M, K], b [N, K]
    c = gemm_fp8_blockwise(g, g_scale, w, w_scale, layout="NN")       # NN (dgrad):   a [M, K], b [K, N]
    c = gemm_fp8_blockwise(gt, gt_scale, x, x_scale, layout="TN")     # TN (wgrad):   a [K, M], b [K, N]

C[M, N] = sum over 128-wide K blocks kb of (A_kb . B_kb) * a_scale(m, kb) * b_scale(n, kb); scales are fp32
dequantization multipliers (x ~= q * s, as rocjit's quantizers return them).
- a_scale: one per row of op(A) and K block: [M, ceil(K/128)] for layout N..., [ceil(K/128), M] for T...
- b_scale: one per 128 x 128 tile of B: [ceil(N/128), ceil(K/128)] for ...T, [ceil(K/128), ceil(N/128)] for ...N;
  or one per row of op(B) and K block (B is an activation, as in wgrad): [N, ceil(K/128)] / [ceil(K/128), N].
  Scales may have any strides. The Hopper TMA kernel copies each K block's A scales (and per-row B scales) into
  shared memory with one bulk copy, from M-major memory: (M, K/128) with strides (1, M), M % 4 == 0, 16-byte
  aligned -- quantize_fp8_dual's s_row (and cuBLASLt's layout); other layouts cost it a small copy per call.
- out_dtype bfloat16 (default), float16 or float32; trans_c=True returns C^T [N, M], written by the kernel's
  transposed-store epilogue (coalesced along C^T's rows); out= writes in place.

Decisions:
- The kernel reads K-major operands (each row of op(A) and each column of op(B) contiguous along K). The layout
  names what the arrays mean; their memory decides the cost: an operand whose memory is K-major (e.g. the
  quantizers' transposed outputs, passed as `.t()` views) is used in place, any other one is first copied
  K-major (one pass over it, no scale change). rocjit's FP8 Linear gets every operand K-major from the
  quantizers (quantize_fp8_dual(transpose_col=True), quantize_fp8_weight(transposed=True)), so its forward
  (NT), dgrad (NN) and wgrad (TN) never copy.
- Any M, N, K >= 1. K % 128 != 0 is handled (the last K block is zero-filled; EVEN_K specialises K % 128 == 0);
  K % 16 != 0 (rows not 16-byte aligned) is handled by copying the operands into zero-padded K-major buffers.
- NVIDIA sm_89+ (mma.sync m16n8k32 e4m3, cp.async ring) and AMD gfx942 / gfx950 (MFMA 16x16x32 fp8) run the
  same source; the operands must be the device's FP8 format (e4m3fn; e4m3fnuz on gfx942).
- Hopper (sm_90a) also has gemm_fp8_blockwise_sm90.hip: warpgroup MMAs (wgmma m64n128k32 e4m3) fed from the same
  128B-swizzled shared-memory ring, optionally with a warp-specialized copy warpgroup. Its configs carry
  "kernel": "sm90"; it covers every case of the op (tails, K % 128, per-row B scales, the transposed store).
  On sm_90a its configs join the tuner's candidates and are the built-in default above 64 rows (H100, 4096^3 NT:
  about 650 TFLOP/s against 207 for the mma.sync kernel); ROCJIT_GEMM_FP8_SM90=0 leaves them out. The TMA-fed
  kernel of that file runs two math warpgroups, or three on 192 x 128 tiles: with per-row B scales (wgrad) the
  promotion multiplies twice per element and outlasts the other warpgroup's wgmmas; a third keeps the tensor cores
  fed (H200, TN 8192^3: 960 TFLOP/s against 885 for the best two-warpgroup tile). Products with fewer tiles than
  multiprocessors get split-K twins of its 128-row tiles (split_candidates: K blocks cut into ranges, fp32
  partials summed in split order by a second kernel, gemm_fp8_splitk_sum; H200, 64 x 2112 x 7168: 12.7 us against
  24.5 unsplit); for them the TMA kernel also has a 128 x 64 tile (twice the tiles of 128 x 128, so fewer ranges,
  or none: H200, TN 128 x 7168 x 2048 9.0 us against 12.8 on 128 x 128, see default_config). Products of at most
  ROWS64_MAX_M rows get 64-row tiles and their split twins, on one math warpgroup or on two taking turns over the K
  blocks (H200, NT 64 x 2112 x 7168: 10.5 us on one, 9.8 on two, against 13.3 on the 128-row tiles). Products whose tiles leave the grid's last round at most half full get
  tail-split twins (tail_candidates: that round's tiles cut into K ranges, their partials summed by
  gemm_fp8_tail_sum), which the tuner times; the built-in default takes the 192 x 128 tile's twin where its ranges
  are long (TAIL_DEFAULT_KBLOCKS).
  tests/gpu/test_gemm_fp8.py checks every one of its configs directly either way.
- Decode (M <= 32 rows, operands K-major as in NT, B scales per 128 x 128 tile, C not transposed, NVIDIA sm_89+):
  skinny_gemm_blockwise_kernel (skinny_gemm.hip, rocjit.ops.skinny's matrix-core kernel with the scales applied per
  128-wide K block) joins the candidates and is the built-in default; these sizes are tuned as graph replays over
  weights rotated beyond L2 (H100, 7168 x 16384 at M = 1: 38 us, the weights at copy bandwidth, against 51 for
  cuBLASLt's blockwise GEMM at M = 4 and 72 for the wgmma tiles).
- Tile configs are tuned per (M, N, K) bucket and persisted by rocjit.tune (shipped defaults in
  tune_defaults.json; ROCJIT_AUTOTUNE=0 uses them or the built-in heuristic).
"""
import functools
import os

from rocjit import tune
from rocjit.ops import _common as C
from rocjit.ops import _gemm as G
from rocjit.ops._op import UNRECORDED, op

SRC = "gemm_fp8_blockwise.hip"
SRC_SM90 = "gemm_fp8_blockwise_sm90.hip"
BLOCK = 128
LAYOUTS = ("NT", "NN", "TN")
NAME = "gemm_fp8_blockwise"

# (BM, BN, WM, WN): block tile and warps; NVIDIA rings 4 stages (3 for the largest tile when shared memory is
# short), AMD 2 (its copies are synchronous, and gfx942 has 64 KB of LDS).
_TILES = ((128, 128, 2, 4), (128, 64, 4, 2), (64, 128, 2, 2), (64, 64, 2, 2))


# sm_90a wgmma kernel: (BM, BN, stages, warp-specialized); BM = 64 rows per consumer warpgroup
_SM90_TILES = ((128, 128, 6, True), (128, 256, 4, False), (128, 128, 4, False), (64, 128, 4, False))
# sm_90a TMA kernel: (BM, BN, stages, pipelined partials, cluster); BM = 128 * m64 slabs per math warpgroup. The
# 192-column tile (one slab, 96 floats of partial and of accumulator per thread) is for shapes whose 128-column tiles
# leave the last wave short: H200, 4096 x 2112 x 7168 1042 TFLOP/s against 849 for the best 128-column tile. The
# 192 x 128 tile runs three math warpgroups of one slab each (gemm_fp8_blockwise_tma3_kernel), for the promotions
# that outlast the other warpgroup's wgmmas (per-row B scales). The 64-row tiles run one math warpgroup of one slab
# (gemm_fp8_blockwise_tma1_kernel, 256 threads), for products of at most ROWS64_MAX_M rows
_TMA_TILES = ((256, 128, 4, False, 2), (256, 128, 4, False, 1), (128, 128, 6, True, 2), (128, 128, 6, True, 1),
              (128, 128, 6, False, 2), (128, 128, 6, False, 1), (128, 192, 5, False, 1), (192, 128, 5, False, 1),
              (128, 64, 8, False, 1), (64, 128, 8, True, 1), (64, 128, 8, False, 1),
              (64, 64, 12, True, 1), (64, 64, 12, False, 1))
# products of at most this many rows are offered the 64-row TMA tiles and default to them (H200: at M = 128 none of
# them was the fastest config at any of five DeepSeek-V3 shapes)
ROWS64_MAX_M = 64
# sm_90a TMA kernel, 64-row tiles whose `kwg` math warpgroups take turns over the K blocks (gemm_fp8_blockwise_tmak_
# kernel): (BN, stages, kwg). Each warpgroup is a chain of wgmmas, waits and promotions of its own, so one slab's
# tile has two in flight where the one-warpgroup tile has one; the stages a multiple of kwg, with room for the
# accumulators the second warpgroup hands to the first (64 x BN floats). H200, graph replays, three alternating
# rounds, NT / TN µs, against the same tile and K ranges on one warpgroup: 64 x 7168 x 2048 64 x 64 7.6 / 7.6 against
# 8.6 / 8.8; 64 x 2112 x 7168 64 x 64 in 4 ranges 9.8 / 9.1 against 10.5 / 10.1; 64 x 4096 x 7168 64 x 64 in 2
# 13.5 / 13.7 against 14.6 / 15.8; 64 x 7168 x 16384 64 x 128 in 2 37.1 / 38.0 against 38.7 / 39.9; 64 x 24576 x 1536
# 64 x 128 16.1 / 13.7 against 17.2 / 16.2. Three warpgroups (64 x 64, 9 stages) were no faster than two at any of
# them, and at M = 128 no such tile was the fastest config at any of the five shapes: offered, as the other 64-row
# tiles, to products of at most ROWS64_MAX_M rows.
_TMA_KWG_TILES = ((64, 12, 2), (128, 6, 2))


def tma_enabled() -> bool:
    """Whether the op offers the TMA-fed wgmma kernel on sm_90a (ROCJIT_GEMM_FP8_TMA=0 leaves it out)."""
    return os.environ.get("ROCJIT_GEMM_FP8_TMA", "1") != "0"


def sm90_enabled() -> bool:
    """Whether the op offers the wgmma kernel on sm_90a (ROCJIT_GEMM_FP8_SM90=0: only the mma.sync kernel)."""
    return os.environ.get("ROCJIT_GEMM_FP8_SM90", "1") != "0"


def _stage_bytes(bm: int, bn: int) -> int:
    return (bm + bn) * BLOCK + (bm + bn) * 4


def smem_bytes(cfg: dict) -> int:
    if cfg.get("kernel") in ("sm90", "tma"):       # ring + scales + 2 mbarriers per stage + 1024 B to align the ring
        # (+ kwg: the accumulators handed to the first math warpgroup)
        return cfg["stages"] * (_stage_bytes(cfg["bm"], cfg["bn"]) + 16) + 1024 + \
            (cfg.get("kwg", 1) - 1) * cfg["bm"] * cfg["bn"] * 4
    return max(cfg["stages"] * _stage_bytes(cfg["bm"], cfg["bn"]), cfg["bm"] * (cfg["bn"] + 1) * 4)


def is_sm90a(target: str) -> bool:
    return target in ("sm_90a",)


def threads(cfg: dict, target: str) -> int:
    if cfg.get("kernel") == "sm90":
        return (cfg["bm"] // 64 + int(cfg["ws"])) * 128
    if cfg.get("kernel") == "tma":
        return 128 * (cfg["kwg"] + 1) if "kwg" in cfg else {192: 512, 64: 256}.get(cfg["bm"], 384)
    from rocjit import targets
    return cfg["wm"] * cfg["wn"] * targets.wave_size(target)


def candidates(target: str, smem_limit: int, sm90: bool | None = None) -> list[dict]:
    """Tile configs that fit `smem_limit`; on sm_90a the TMA kernel's and the wgmma kernel's first when `sm90`
    (default: sm90_enabled()). Every config takes either kind of B scales."""
    nvidia = target.startswith("sm_")
    out = []
    hopper = (sm90_enabled() if sm90 is None else sm90) and is_sm90a(target)
    if hopper and tma_enabled():
        for bm, bn, stages, pipe, cluster in _TMA_TILES:
            cfg = {"kernel": "tma", "bm": bm, "bn": bn, "stages": stages, "pipe": pipe, "cluster": cluster}
            if smem_bytes(cfg) <= smem_limit:
                out.append(cfg)
        for bn, stages, kwg in _TMA_KWG_TILES:
            cfg = {"kernel": "tma", "bm": 64, "bn": bn, "stages": stages, "pipe": False, "cluster": 1, "kwg": kwg}
            if smem_bytes(cfg) <= smem_limit:
                out.append(cfg)
    if hopper:
        for bm, bn, stages, ws in _SM90_TILES:
            cfg = {"kernel": "sm90", "bm": bm, "bn": bn, "stages": stages, "ws": ws}
            if smem_bytes(cfg) <= smem_limit:
                out.append(cfg)
    for bm, bn, wm, wn in _TILES:
        for stages in ((4, 3) if nvidia else (2,)):
            cfg = {"bm": bm, "bn": bn, "wm": wm, "wn": wn, "stages": stages}
            if smem_bytes(cfg) <= smem_limit:
                out.append(cfg)
                break
    return out


# Split-K for the TMA kernel: products with fewer tiles than multiprocessors leave most of them idle for the whole
# K loop (128 x 2112 x 7168: 17 tiles of 128 x 128, 56 K blocks each). Cutting each tile's K blocks into `splits`
# ranges gives every range a block of its own; the fp32 partials are summed in split order by a second kernel.
SPLIT_MIN_KBLOCKS = 4          # K blocks per range at least: the ring's fill and drain amortised over them


def split_candidates(M: int, N: int, K: int, sms: int, cands: list[dict]) -> list[dict]:
    """Split-K twins ("splits": s) of the one-block TMA tiles of 64 and 128 rows, for products whose tiles fill at
    most half the multiprocessors: s the most ranges that keep one wave (tiles x s <= sms) and >= SPLIT_MIN_KBLOCKS
    K blocks each, and half of that when it is 2 or more."""
    kblocks = C.ceil_div(K, BLOCK)
    out = []
    for c in cands:
        if c.get("kernel") != "tma" or c["bm"] not in (64, 128) or c["cluster"] != 1:
            continue
        tiles = C.ceil_div(M, c["bm"]) * C.ceil_div(N, c["bn"])
        most = min(sms // tiles, kblocks // SPLIT_MIN_KBLOCKS)
        for s in sorted({most, most // 2}, reverse=True):
            if s >= 2:
                out.append(dict(c, splits=s))
    return out


# The built-in default among one-wave configs of products whose 128-column tiles fill at most half the
# multiprocessors, for K of at most NARROW_MAX_KBLOCKS K blocks (default_config): the fewest K ranges among those
# within SPLIT_UNITS_BAND of the most work units, the unsplit 128 x 64 tile counted. H200, NT / TN (TN
# against cuBLASLt's 1 x 128 x 1 x 128 recipe), graph replays, three alternating rounds, µs: 128 x 2112 x 7168 on
# 128 x 64 in 4 ranges 11.3 / 12.2 (128 x 128 in 7: 12.8 / 14.3; cuBLASLt 22.6 / 11.2); 128 x 4096 x 7168 on 128 x 64
# in 2 ranges 14.6 / 16.1 (128 x 128 in 4: 14.9 / 17.7; cuBLASLt 22.2 / 13.2); 128 x 7168 x 2048 on 128 x 64 unsplit
# 8.3 / 9.0 (128 x 128 in 2: 13.2 TN; unsplit 10.3 / 12.8; cuBLASLt 9.1 / 9.2); 256 x 4096 x 7168 on 128 x 64
# unsplit 20.4 / 22.8 (128 x 128 in 2: 22.0 / 25.3). Where K is long the split 128 x 128 tile wins (128 x 7168 x
# 16384, 128 K blocks: 41.0 / 45.5 in 2 ranges against 42.7 / 47.2 for 128 x 64 unsplit; there the default keeps
# the most work units); at 64 x 4096 x 7168 the rule's 128 x 64 in 2 ranges ran within 3% of the best (128 x 128 in
# 4, 17.0 / 17.4).
SPLIT_UNITS_BAND = 0.9
NARROW_MAX_KBLOCKS = 64


# The 128 x 192 TMA tile's throughput per tile relative to 256 x 128's, once both are normalized for how full
# their last wave is (H100, one run: 0.91 - 1.03 over six shapes): the default takes it where its fuller last wave
# outweighs that
WIDE_TILE_EFFICIENCY = 0.95


# Tail split for the TMA kernel: where the tiles leave the grid's last round partly empty (H200, TN 4096 x 4096 x 7168
# on 192 x 128 tiles: 704 tiles, 5.33 rounds of 132; M = 3840, 640 tiles in 5 rounds, ran at 1031 TFLOP/s against
# 955), the last round's tiles are cut into `tail` K ranges, one block each, summed by a second kernel.
def tail_candidates(M: int, N: int, K: int, sms: int, cands: list[dict]) -> list[dict]:
    """Tail-split twins ("tail": s) of the one-block TMA tiles for products of more tiles than multiprocessors whose
    last round fills at most half of them: s the most K ranges that keep that round one wave (rem x s <= sms) with
    >= SPLIT_MIN_KBLOCKS K blocks each."""
    kblocks = C.ceil_div(K, BLOCK)
    out = []
    for c in cands:
        if not _whole_tile(c) or c["bm"] == 64:
            continue
        tiles = C.ceil_div(M, c["bm"]) * C.ceil_div(N, c["bn"])
        rem = tiles % sms
        if tiles <= sms or rem == 0 or 2 * rem > sms:
            continue
        s = min(sms // rem, kblocks // SPLIT_MIN_KBLOCKS)
        if s >= 2:
            out.append(dict(c, tail=s))
    return out


# Ranges of at least this many K blocks make the 192 x 128 tile's tail-split twin the built-in default where cands
# hold one. H200, three tail ranges against the unsplit tile, five alternating rounds, graph replays (medians, µs):
# 4096 x 4096 x 7168 (ranges of 18 - 19 blocks) NT 207.0 / 225.0, TN 266.7 / 281.0; 4096 x 7168 x 16384 (42 - 43) NT
# 870.2 / 902.9, TN 1105.0 / 1123.1; shorter ranges lost or tied: 4096^3 (10 - 11) NT 130.9 / 128.5, TN 154.6 / 161.4,
# 4096 x 7168 x 2048 (5 - 6) NT 123.2 / 115.8, TN 147.5 / 146.5
TAIL_DEFAULT_KBLOCKS = 16


def _whole_tile(c: dict) -> bool:
    """A one-block TMA config that runs its tiles whole: no cluster, no split-K, no tail split."""
    return c.get("kernel") == "tma" and c["cluster"] == 1 and "splits" not in c and "tail" not in c


def _pipe_rank(c: dict) -> int:
    """0 for the preferred of a tile's two configs: pipelined partials on 128 columns (faster than without at 5 of 6
    shapes measured), without on 64 (where the built-in rule's choices were measured); 1 for the other."""
    return int(c["pipe"] != (c["bn"] == 128))


def _fewest_ranges(pool: list[dict], units) -> dict:
    """Of `pool`, the fewest K ranges among the configs within SPLIT_UNITS_BAND of the most work units, then the
    wider tile, then _pipe_rank."""
    most = max(units(c) for c in pool)
    return min((c for c in pool if units(c) >= SPLIT_UNITS_BAND * most),
               key=lambda c: (c.get("splits", 1), -c["bn"], _pipe_rank(c)))


def _turns_twin(c: dict, turns: list[dict]) -> dict:
    """The config of `turns` (64-row tiles of math warpgroups taking turns over the K blocks) with c's tile and K
    ranges, else c: faster than c's one warpgroup at each of the ten shapes and layouts of _TMA_KWG_TILES'
    measurements, pipelined partials or not."""
    return next((t for t in turns if t["bm"] == c["bm"] and t["bn"] == c["bn"] and
                 t.get("splits", 1) == c.get("splits", 1) and "tail" not in t and "tail" not in c), c)


def default_config(M: int, N: int, sms: int, cands: list[dict], K: int | None = None) -> dict:
    """Products of at most ROWS64_MAX_M rows on the TMA kernel: 64-row tiles (a 128-row tile multiplies as many dead
    rows as live ones), each chosen below for one math warpgroup and run on two taking turns where cands hold that
    twin (_turns_twin) -- with K given and at most NARROW_MAX_KBLOCKS K blocks, by the rule
    below over their split twins and unsplit tiles that fit one round; longer K (or K not given), the twin with the
    most work units, the wider tile on a tie; where their tiles fill the GPU, 64 x 128 with pipelined partials (H200,
    NT / TN, µs, graph replays, three alternating rounds, against the shipped 128-row choices: 64 x 7168 x 2048
    unsplit 64 x 64 8.6 / 8.8 against 10.4 / 9.2; 64 x 2112 x 7168 64 x 64 in 4 ranges 10.5 / 10.2 against 13.3 /
    13.0; 64 x 4096 x 7168 64 x 64 in 2 14.6 / 15.9 (64 x 128 in 4: 14.8 / 12.5) against 16.8 / 15.3; 64 x 7168 x
    16384 64 x 128 pipelined in 2 38.1 / 38.8 against 40.2 / 43.9; 64 x 24576 x 1536, 192 tiles of 64 x 128, 16.7 /
    15.6 against 15.5 / 14.5 for 128 x 192).
    Else, where cands hold split-K twins of the 128-row tiles (split_candidates) and K is given and at most
    NARROW_MAX_KBLOCKS K blocks: of those and the unsplit 128 x 64 tile where its tiles fit one round, the fewest K
    ranges among the configs within SPLIT_UNITS_BAND of the most work units (tiles x ranges), then the wider tile,
    then _pipe_rank: a range more costs its fp32 partials and their sum more than a few idle
    multiprocessors (measurements above SPLIT_UNITS_BAND). Longer K (or K not given): the twin with the most work
    units, the wider tile on a tie, then _pipe_rank (H200, M = 128: 7168 x 16384 41.0 us on 128 x 128
    in 2 ranges against 42.7 for 128 x 64 unsplit).
    Small M without the TMA kernel: 64-row tiles; else 128 x 128 when it gives every multiprocessor a tile, else
    128 x 64.
    sm_90a above 64 rows: the TMA kernel without clusters (measured no faster on an H100 at most shapes of
    `bench gemm_fp8`): 192 x 128 tiles on three math warpgroups when they give every multiprocessor one (H200, the
    fastest tile at 4 of 7 shapes NT, 6 of 7 TN, within 5% of the best at the others) -- their tail-split twin where
    cands hold one and K is given and its ranges are at least TAIL_DEFAULT_KBLOCKS K blocks; else 256 x 128 when that gives
    every multiprocessor one -- or 128 x 192 where its rounds of tiles take less time (rounds x tile area /
    WIDE_TILE_EFFICIENCY: 4096 x 2112, 1002 against 756 TFLOP/s on an H100) -- else 128 x 128 with pipelined
    partials (faster than without at 5 of 6 shapes measured);
    with the TMA kernel turned off, the wgmma kernel's largest such tile (128 x 256, then 128 x 128), else 64 x 128."""
    turns = [c for c in cands if "kwg" in c]          # taken only as the twins of the rule's 64-row choices
    cands = [c for c in cands if "kwg" not in c]
    tiles = lambda bm, bn: C.ceil_div(M, bm) * C.ceil_div(N, bn)  # noqa: E731
    units = lambda c: tiles(c["bm"], c["bn"]) * c.get("splits", 1)  # noqa: E731
    long_k = K is None or C.ceil_div(K, BLOCK) > NARROW_MAX_KBLOCKS
    by_rank = lambda c: (units(c), c["bn"], -_pipe_rank(c))  # noqa: E731

    def few_tiles(bm, narrow):
        """The split-K rule over the twins of the bm-row tiles and the unsplit configs `narrow` whose tiles fit one
        round; None where bm-row tiles have no twins here."""
        split = [c for c in cands if c.get("kernel") == "tma" and c["bm"] == bm and c.get("splits", 1) > 1]
        if not split:
            return None
        if long_k:
            return max(split, key=by_rank)
        return _fewest_ranges(split + [c for c in narrow if tiles(c["bm"], c["bn"]) <= sms], units)

    whole = [c for c in cands if _whole_tile(c)]
    if M <= ROWS64_MAX_M:
        rows64 = [c for c in whole if c["bm"] == 64]
        chosen = few_tiles(64, rows64)
        if chosen is None and any(c["bn"] == 128 for c in rows64):
            chosen = min((c for c in rows64 if c["bn"] == 128), key=_pipe_rank)
        if chosen is not None:
            return _turns_twin(chosen, turns)
    chosen = few_tiles(128, [c for c in whole if c["bm"] == 128 and c["bn"] == 64])
    if chosen is not None:
        return chosen
    three = next((c for c in cands if c.get("kernel") == "tma" and c["bm"] == 192 and "tail" not in c), None)
    if three is not None and M > 64 and tiles(192, 128) >= sms:
        twin = next((c for c in cands if "tail" in c and {k: v for k, v in c.items() if k != "tail"} == three), None)
        if twin is not None and K is not None and \
                C.ceil_div(C.ceil_div(K, BLOCK), twin["tail"]) >= TAIL_DEFAULT_KBLOCKS:
            return twin
        return three
    by_bm = {}                                     # per tile height: pipelined partials where a candidate has them
    for c in cands:
        if _whole_tile(c) and c["bn"] == 128 and c["bm"] in (128, 256) and (c["bm"] not in by_bm or c["pipe"]):
            by_bm[c["bm"]] = c
    tma = [by_bm[bm] for bm in sorted(by_bm, reverse=True)]
    wide = next((c for c in cands if c.get("kernel") == "tma" and c["bn"] == 192), None)

    def rounds_time(c, efficiency=1.0):
        return C.ceil_div(tiles(c["bm"], c["bn"]), sms) * c["bm"] * c["bn"] / efficiency
    if tma and M > 64:
        for c in tma:                              # the largest tile that gives every multiprocessor one
            if tiles(c["bm"], c["bn"]) >= sms or c is tma[-1]:
                if c["bm"] == 256 and wide is not None and \
                        rounds_time(wide, WIDE_TILE_EFFICIENCY) < rounds_time(c):
                    return wide
                return c
    wg = [c for c in cands if c.get("kernel") == "sm90"]
    if wg and M > 64:
        for bm, bn in ((128, 256), (128, 128), (64, 128)):
            c = next((c for c in wg if c["bm"] == bm and c["bn"] == bn and not c["ws"]), None)
            if c is not None and (tiles(bm, bn) >= sms or bm == 64):
                return c
        return wg[0]
    cands = [c for c in cands if "kernel" not in c]

    def pick(bm, bn):
        return next((c for c in cands if c["bm"] == bm and c["bn"] == bn), cands[-1])
    if M <= 64:
        return pick(64, 64) if tiles(64, 128) < sms else pick(64, 128)
    return pick(128, 128) if tiles(128, 128) >= sms else pick(128, 64)


# ----------------------------------------------------------------------------- checks
def _fp8_dtypes():
    tm = C.torch()
    return tuple(d for d in (getattr(tm, "float8_e4m3fn", None), getattr(tm, "float8_e4m3fnuz", None)) if d)


def _check(a, a_scale, b, b_scale, layout, out_dtype, out, trans_c):
    tm = C.torch()
    if layout not in LAYOUTS:
        raise ValueError(f"{NAME}: layout must be one of {LAYOUTS} (NT forward, NN dgrad, TN wgrad), got {layout!r}")
    for nm, t in (("a", a), ("b", b)):
        C.check_tensor(NAME, nm, t, dtypes=_fp8_dtypes(), dim=2, contiguous=False)
    if a.dtype != b.dtype:
        raise TypeError(f"{NAME}: a and b must share an FP8 dtype, got {a.dtype} and {b.dtype}")
    dev = a.device
    M, K = (a.shape[0], a.shape[1]) if layout[0] == "N" else (a.shape[1], a.shape[0])
    Kb, N = (b.shape[1], b.shape[0]) if layout[1] == "T" else (b.shape[0], b.shape[1])
    a_form = "[M, K]" if layout[0] == "N" else "[K, M]"
    b_form = "[N, K]" if layout[1] == "T" else "[K, N]"
    if Kb != K:
        raise ValueError(f"{NAME}: layout {layout} reads a as {a_form} = {tuple(a.shape)} and b as {b_form} = "
                         f"{tuple(b.shape)}: their K differ ({K} vs {Kb})")
    KB, NB = C.ceil_div(K, BLOCK), C.ceil_div(N, BLOCK)
    C.check_tensor(NAME, "b", b, device=dev, contiguous=False)
    for nm, s in (("a_scale", a_scale), ("b_scale", b_scale)):
        C.check_tensor(NAME, nm, s, dtypes=(tm.float32,), dim=2, device=dev, contiguous=False)
    want_a = (M, KB) if layout[0] == "N" else (KB, M)
    if tuple(a_scale.shape) != want_a:
        raise ValueError(f"{NAME}: a_scale must have shape {want_a} (one scale per row of op(A) and 128-wide K "
                         f"block, laid out like a {a_form}), got {tuple(a_scale.shape)}")
    tiles, rows = ((NB, KB), (N, KB)) if layout[1] == "T" else ((KB, NB), (KB, N))
    if tuple(b_scale.shape) == tiles:
        sb_rows = False
    elif tuple(b_scale.shape) == rows:
        sb_rows = True
    else:
        raise ValueError(f"{NAME}: b_scale must have shape {tiles} (one per 128 x 128 tile of b) or {rows} (one per "
                         f"row of op(B) and 128-wide K block), got {tuple(b_scale.shape)}")
    od = out_dtype if out_dtype is not None else tm.bfloat16
    if od not in (tm.bfloat16, tm.float16, tm.float32):
        raise TypeError(f"{NAME}: out_dtype must be bfloat16, float16 or float32, got {od}")
    shape = (N, M) if trans_c else (M, N)
    if out is not None:
        if not isinstance(out, tm.Tensor) or tuple(out.shape) != shape or out.dtype != od or out.device != dev \
                or not out.is_contiguous():
            raise ValueError(f"{NAME}: out must be a contiguous {od} tensor of shape {shape} on {dev}, got "
                             f"{getattr(out, 'dtype', type(out).__name__)} {tuple(getattr(out, 'shape', ()))}")
    return M, N, K, sb_rows, od, shape


def _device_check(a):
    if not a.is_cuda:
        raise ValueError(f"{NAME}: a must be on a GPU, got {a.device}")
    target, _, _ = G._device(a.device.index or 0)
    if not G.has_matrix_path(target, fp8=True) or target.startswith("gfx90a"):
        raise NotImplementedError(f"{NAME}: needs FP8 matrix cores (NVIDIA sm_89+, AMD gfx942 / gfx950); this "
                                  f"device is {target}")
    native = C.native_fp8(a.device.index or 0)
    if str(a.dtype).replace("torch.float8_", "") != native:
        raise TypeError(f"{NAME}: this device multiplies {native} FP8; a and b are {a.dtype} "
                        f"(quantize with rocjit.ops.quantize_fp8(..., fp8_format={native!r}))")
    return target


# ----------------------------------------------------------------------------- operands
def _kmajor(x, K):
    """A contiguous [R, K'] uint8 view/copy of the logical [R, K] operand x, K' >= K a multiple of 16 (zero
    padded), and whether it is x's own memory."""
    tm = C.torch()
    u = x.view(tm.uint8)
    if u.is_contiguous() and K % 16 == 0 and C.aligned(u):
        return u, True
    K16 = -(-K // 16) * 16
    buf = tm.empty((u.shape[0], K16), dtype=tm.uint8, device=u.device)
    if K16 > K:
        buf[:, K:].zero_()
    buf[:, :K].copy_(u)
    return buf, False


def _strided(s):
    """(contiguous tensor holding s's memory, stride of dim 0, stride of dim 1 of s)."""
    if s.is_contiguous():
        return s, s.stride(0), s.stride(1)
    if s.t().is_contiguous():
        return s.t(), s.stride(0), s.stride(1)
    c = s.contiguous()
    return c, c.stride(0), c.stride(1)


def _launch(cfg, c, a_km, b_km, sa, sb, M, N, K, sb_rows, trans_c, call=UNRECORDED):
    """One kernel launch: a_km [M, K'] / b_km [N, K'] uint8 K-major, sa / sb (tensor, stride, stride)."""
    if cfg.get("kernel") == "skinny_mma":
        target = G._device(c.device.index or 0)[0]
        return G.launch_mma_blockwise(a_km, b_km, c, sa, sb, M, N, b_km.shape[1], cfg, target,
                                      G.targets.wave_size(target), call)
    vec_out = (M if trans_c else N) % 8 == 0 and C.aligned(c)
    flags = f"{C.cbool(K % BLOCK == 0)}, {C.cbool(sb_rows)}, {C.cbool(trans_c)}, {C.cbool(vec_out)}"
    if cfg.get("kernel") == "tma":
        return _launch_tma(cfg, c, a_km, b_km, sa, sb, M, N, K, sb_rows, trans_c, vec_out, call)
    if cfg.get("kernel") == "sm90":
        name = (f"gemm_fp8_blockwise_sm90_kernel<{G.ctype(c.dtype)}, {cfg['bm']}, {cfg['bn']}, {cfg['stages']}, "
                f"{C.cbool(cfg['ws'])}, {flags}>")
        kernel = C.module(SRC_SM90)[name]
    else:
        name = (f"gemm_fp8_blockwise_kernel<{G.ctype(c.dtype)}, {cfg['bm']}, {cfg['bn']}, {cfg['wm']}, {cfg['wn']}, "
                f"{cfg['stages']}, {flags}>")
        kernel = C.module(SRC)[name]
    target = G._device(c.device.index or 0)[0]
    grid = C.ceil_div(M, cfg["bm"]) * C.ceil_div(N, cfg["bn"])
    call.launch(kernel, grid, threads(cfg, target), c, a_km, b_km, sa[0], sb[0], M, N, K, a_km.stride(0), b_km.stride(0),
                c.stride(0), sa[1], sa[2], sb[1], sb[2], shared_mem=smem_bytes(cfg))
    return c


def _launch_tma(cfg, c, a_km, b_km, sa, sb, M, N, K, sb_rows, trans_c, vec_out, call):
    """The TMA kernel: the operands go in as tensor maps (by-value kernel parameters, encoded by the driver for each
    address; cuda.tensor_map_2d keeps them per address), which an eager plan makes again from each call's operands
    (Call.derive); the scales laid out as its bulk copies read them (_k_block_rows); with split-K, its fp32 partials
    in the stream's workspace, summed into c in split order by gemm_fp8_splitk_sum; with a tail split, the last
    round's partial slabs there, summed into their tiles by gemm_fp8_tail_sum."""
    bm, cluster, splits, tail = cfg["bm"], cfg["cluster"], cfg.get("splits", 1), cfg.get("tail", 0)
    kernel, grid, block = _tma_kernel(cfg, c.dtype, sb_rows, trans_c, vec_out, M, N, c.device.index or 0)
    tiles = C.ceil_div(M, bm) * C.ceil_div(N, cfg["bn"])
    rem = tiles % grid if tail > 1 else 0          # the tiles of the last round, cut into `tail` K ranges
    sa = _k_block_rows(sa, M, K, call)
    if sb_rows:
        sb = _k_block_rows(sb, N, K, call)
    ta = call.derive(G.tensor_map_fn(K, M, a_km.stride(0), bm // cluster), a_km)
    tb = call.derive(G.tensor_map_fn(K, N, b_km.stride(0), cfg["bn"]), b_km)
    # with split-K the partials, in the stream's fp32 scratch (so the plan belongs to that stream); else an unread
    # argument, the device's dummy (a tensor still: the generated fast launcher takes tensors only, and None sent
    # the launch down the general path, about 30 us more host time), and the plan replays on any stream
    if splits > 1:
        ws = call.const(G._stream_workspace(c.device, splits * M * N))
        call.bind_stream()
    elif rem:
        ws = call.const(G._stream_workspace(c.device, rem * tail * bm * cfg["bn"]))
        call.bind_stream()
    else:
        ws = call.const(C.dummy_f32(c.device.index or 0))
    call.launch(kernel, grid, block, ta, tb, c, ws, splits, tail if rem else 0, sa[0], sb[0], M, N, K, c.stride(0),
                sa[1], sa[2], sb[1], sb[2], shared_mem=smem_bytes(cfg))
    if splits > 1:
        rows, cols = c.shape                     # C [M, N] or C^T [N, M], contiguous; the partials laid out alike
        vec = rows * cols % 8 == 0 and C.aligned(c)      # 8 elements per thread (see gemm_fp8_splitk_sum)
        call.launch(_reducer(c.dtype, vec), C.ceil_div(rows * cols, 256 * (8 if vec else 1)), 256, ws, c, splits,
                    rows, cols)
    elif rem:
        call.launch(_tail_reducer(c.dtype, bm, cfg["bn"], trans_c), (8, rem), 256, ws, c, tiles - rem, tail, M, N,
                    c.stride(0))
    return c


@functools.lru_cache(maxsize=None)
def _reducer(dtype, vec: bool):
    """gemm_fp8_splitk_sum: the TMA kernel's split-K partials (already scaled) summed in split order into a C of
    `dtype`; `vec`: 8 elements per thread (C 16-byte aligned, its size a multiple of 8)."""
    return C.module(SRC_SM90)[f"gemm_fp8_splitk_sum<{G.ctype(dtype)}, {C.cbool(vec)}>"]


@functools.lru_cache(maxsize=None)
def _tail_reducer(dtype, bm: int, bn: int, trans_c: bool):
    """gemm_fp8_tail_sum: the tail split's partial slabs summed in range order into the last round's tiles of C."""
    return C.module(SRC_SM90)[f"gemm_fp8_tail_sum<{G.ctype(dtype)}, {bm}, {bn}, {C.cbool(trans_c)}>"]


def _tma_kernel(cfg, od, sb_rows, trans_c, vec_out, M, N, dev):
    """(kernel, grid, threads) of the TMA kernel for a config and product."""
    bm, bn, cluster = cfg["bm"], cfg["bn"], cfg["cluster"]
    flags = f"{C.cbool(sb_rows)}, {C.cbool(trans_c)}, {C.cbool(vec_out)}"
    if bm == 192:                       # three math warpgroups of one slab
        name = f"gemm_fp8_blockwise_tma3_kernel<{G.ctype(od)}, {cfg['stages']}, {flags}>"
    elif "kwg" in cfg:                  # math warpgroups taking turns over one slab's K blocks
        name = f"gemm_fp8_blockwise_tmak_kernel<{G.ctype(od)}, {cfg['kwg']}, {bn}, {cfg['stages']}, {flags}>"
    elif bm == 64:                      # one math warpgroup of one slab
        name = f"gemm_fp8_blockwise_tma1_kernel<{G.ctype(od)}, {bn}, {cfg['stages']}, {C.cbool(cfg['pipe'])}, {flags}>"
    else:
        kname = "gemm_fp8_blockwise_tma2_kernel" if cluster == 2 else "gemm_fp8_blockwise_tma_kernel"
        name = f"{kname}<{G.ctype(od)}, {bm // 128}, {bn}, {cfg['stages']}, {C.cbool(cfg['pipe'])}, {flags}>"
    # persistent: at most one block per multiprocessor (pairs of them with clusters), each walking its tiles
    units = C.ceil_div(M, bm) * C.ceil_div(N, bn * cluster) * cfg.get("splits", 1)
    sms = G._device(dev)[2]
    # a tail split takes every multiprocessor: the kernel finds the last round's tiles from its grid
    grid = sms if cfg.get("tail", 0) > 1 and cluster == 1 else min(units, sms // cluster) * cluster
    return C.module(SRC_SM90)[name], grid, threads(cfg, "sm_90a")


def _k_block_rows(s, R, K, call=UNRECORDED):
    """Scales of R rows per K block, (tensor, stride of a row, stride of a K block), as the TMA kernel's bulk copies
    read them: each K block's R scales contiguous, 16-byte aligned, K blocks a multiple of 4 floats apart, R a
    multiple of 4 (a copy's length is rounded up to 16 bytes). quantize_fp8_dual hands its row scales (the A side)
    and, with transpose_col=True, its column scales (wgrad's per-row B side) out so. Anything else is copied into
    that layout by gemm_fp8_scales_kblock_rows, zero-padded (R x ceil(K/128) floats, small next to the product; a
    launch an eager plan replays)."""
    if _bulk_ready(s, R):
        return s
    t, sr, sk = s
    KB, R4 = C.ceil_div(K, BLOCK), -(-R // 4) * 4
    buf = call.empty((KB, R4), C.torch().float32, t.device)
    call.launch(C.module(SRC_SM90)["gemm_fp8_scales_kblock_rows"], C.ceil_div(KB * R4, 256), 256, t, sr, sk, buf, R,
                KB, R4)
    return buf, 1, R4


def _bulk_ready(s, R: int) -> bool:
    """Whether scales (tensor, stride of a row, stride of a K block) of R rows are in the layout _k_block_rows
    hands the TMA kernel as they are."""
    t, sr, sk = s
    return sr == 1 and sk % 4 == 0 and R % 4 == 0 and C.aligned(t)


@functools.lru_cache(maxsize=1)
def src_hash() -> str:
    """What the tuned configs were measured on: the blockwise sources, the skinny source (the decode kernel), every
    header they include, and how the tuner times them (TUNE_TIMING: winners timed otherwise are tuned again)."""
    return tune.source_hash(*tune.kernel_sources(SRC, SRC_SM90, G.SRC), TUNE_TIMING)


# How _config_for's tuner times candidates; part of src_hash
TUNE_TIMING = "graph replays: over rotated copies of b below 2^34 FLOP, of b itself above"


@functools.lru_cache(maxsize=None)
def _smem_limit(dev: int) -> int:
    """The device's opt-in shared memory per block, read once (as _gemm._device does)."""
    from rocjit import platform
    attrs = platform.get().device_attributes(dev)
    return int(attrs.get("max_shared_per_block_optin") or attrs.get("max_shared_memory_per_block_optin")
               or attrs.get("shared_per_block_optin") or 227 * 1024)


# config_for's answers once tune.pick has settled them (a winner it remembers, or its default with autotuning
# off), keyed by everything the answer depends on: the products whose TMA kernel records no eager plan make this
# choice on every call, and candidates() + pick() cost more host time than the rest of the call
_CONFIGS: dict = {}


def config_for(c, a_km, b_km, sa, sb, M, N, K, sb_rows, trans_c, target):
    dev = c.device.index or 0
    memo = (dev, M, N, K, sb_rows, trans_c, a_km.dtype, c.dtype, tune.generation, tune.enabled(),
            os.environ.get("ROCJIT_GEMM_FP8_TMA"), os.environ.get("ROCJIT_GEMM_FP8_SM90"))
    hit = _CONFIGS.get(memo)
    if hit is not None:
        return hit
    cfg = _config_for(c, a_km, b_km, sa, sb, M, N, K, sb_rows, trans_c, target, dev)
    if not tune.capturing():             # under capture pick() answers a default it does not remember
        if len(_CONFIGS) >= 4096:
            _CONFIGS.clear()
        _CONFIGS[memo] = cfg
    return cfg


def decode_candidates(target: str, M: int, N: int, K: int, sms: int, sb_rows: bool, trans_c: bool) -> list[dict]:
    """Configs of skinny_gemm_blockwise_kernel ("kernel": "skinny_mma"; rocjit.ops.skinny's matrix-core kernel with
    blockwise scales: lanes load the weights, grid split-K) for M <= DECODE_M rows, B scales per 128 x 128 tile, C
    not transposed, on NVIDIA with FP8 matrix cores (sm_89+). At decode sizes the product is a stream of B's bytes,
    which tiles of 64 or more rows of A leave to a few dozen blocks (H100, M = 1, 7168 x 16384: the wgmma kernel
    71 us, this one 38.6, the bytes at copy bandwidth 39). (A stream-K variant through a shared-memory ring was
    slower at every DeepSeek-V3 decode shape measured: 50 us there.)"""
    if M > DECODE_M or sb_rows or trans_c or not (target.startswith("sm_") and G.has_matrix_path(target, True)):
        return []
    return [dict({k: v for k, v in c.items() if k != "path"}, kernel="skinny_mma")
            for c in G.mma_blockwise_candidates(M, N, K, sms, target)]


def decode_default(M: int, N: int, K: int, sms: int, cands: list[dict]) -> dict:
    """skinny_gemm_kernel's built-in default shape, blockwise (rocjit.ops._gemm.mma_default)."""
    d = G.mma_default(M, N, K, sms, 1)
    want = dict({k: v for k, v in d.items() if k != "path"}, kernel="skinny_mma")
    return want if want in cands else cands[0]


DECODE_M = 32


def _config_for(c, a_km, b_km, sa, sb, M, N, K, sb_rows, trans_c, target, dev):
    _, devname, sms = G._device(dev)
    decode = decode_candidates(target, M, N, b_km.shape[1], sms, sb_rows, trans_c)
    # 64-row TMA tiles only for products of at most ROWS64_MAX_M rows
    cands = decode + [c for c in candidates(target, _smem_limit(dev))
                      if M <= ROWS64_MAX_M or c.get("kernel") != "tma" or c["bm"] != 64]
    cands += split_candidates(M, N, K, sms, cands) + tail_candidates(M, N, K, sms, cands)
    default = decode_default(M, N, b_km.shape[1], sms, decode) if decode else default_config(M, N, sms, cands, K)

    copies = []
    small = bool(decode) or not _tuned_exactly(M, N, K)

    def bench(cfg):
        # CUDA-graph replays, so no host time is counted: events around the calls timed the host's launch path
        # wherever it outlasts the kernel (the TMA kernel's _launch takes 40 - 130 us of Python, by host: H100,
        # 4096 x 7168 at M = 32: the tuned call ran 27.4 us where the best config runs 17.4; H200 at M = 128:
        # 24576 x 1536 25.2 us where a 128 x 192 tile runs 12.3; at 4096^3, a 116 us kernel, every tile read 915 -
        # 986 TFLOP/s). Small sizes (decode, every bucketed size) run over copies of b rotated beyond L2, as
        # skinny_gemm's tuner does
        if not copies:
            copies.extend(tune.rotation_copies(b_km) if small else [b_km])
        return tune.time_graph([functools.partial(_launch, cfg, c, a_km, bc, sa, sb, M, N, K, sb_rows, trans_c)
                                for bc in copies])

    # per-row B scales (wgrad) are tuned apart: their promotion costs twice the multiplies, so the best tile differs
    # and at decode sizes transposed stores too (the decode kernel does not write them: other candidates)
    tc = "-trans_c" if trans_c and M <= DECODE_M else ""
    dtype = f"{a_km.dtype}-{G.ctype(c.dtype)}{'-sb_rows' if sb_rows else ''}{tc}".replace("torch.", "")
    return tune.pick(NAME, bucket=tune_bucket(M, N, K), dtype=dtype, device=devname, src_hash=src_hash(),
                     candidates=cands, default=default, bench=bench, heat_s=HEAT_S)


HEAT_S = 0.3      # seconds of untimed runs before the tuner times (tune.pick's heat_s): the compiles idled the GPU
EXACT_TUNE_FLOP = 1 << 34      # 2 M N K from here up: tuned for the exact shape


def tune_bucket(M: int, N: int, K: int) -> str:
    """The tuning key's shape part: the exact N and K with M in power-of-two buckets (tune.weight_bucket, as the
    skinny GEMMs); from EXACT_TUNE_FLOP up, the exact shape. A power-of-two bucket shares one winner among shapes
    whose best tiles differ (H100: the op ran 4096 x 4096 x 7168 at 662 TFLOP/s, its best tile timed alone at 966),
    and the tuning run costs little next to the calls it serves. Shipped defaults are found under either key (the
    exact one first, then the power-of-two bucket: tune.pow2_key)."""
    if _tuned_exactly(M, N, K):
        return f"m{M}_n{N}_k{K}"
    return tune.weight_bucket(m=M, n=N, k=K)


def _tuned_exactly(M: int, N: int, K: int) -> bool:
    return 2 * M * N * K >= EXACT_TUNE_FLOP


# ----------------------------------------------------------------------------- the call
# Repeated eager calls are replayed by the op's plans (rocjit.ops._op), including the TMA kernel's: its tensor maps
# are made again from each call's operands (Call.derive), and the scales it reads in place as transposed views --
# quantize_fp8_dual's M-major row scales -- are passed as their argument's data pointer (Call.alias), the plan's key
# fixing their strides; scales in another layout are moved by a launch the plan replays too (_k_block_rows). A call
# that copies an operand K-major, or a scale whose neither layout is contiguous, records no plan.
def _scales(a_scale, b_scale, layout):
    """The (row, K block) views of the scales, (tensor, stride, stride) each (see _strided)."""
    return (_strided(a_scale if layout[0] == "N" else a_scale.t()),
            _strided(b_scale if layout[1] == "T" else b_scale.t()))


def _run(call, a, a_scale, b, b_scale, layout, out_dtype, out, trans_c):
    M, N, K, sb_rows, od, shape = _check(a, a_scale, b, b_scale, layout, out_dtype, out, trans_c)
    target = _device_check(a)
    if out is None:
        out = call.empty(shape, od, a.device)
    if M == 0 or N == 0:
        return out
    if K == 0:
        call.forget()
        return out.zero_()
    a_km, own_a = _kmajor(a if layout[0] == "N" else a.t(), K)
    b_km, own_b = _kmajor(b if layout[1] == "T" else b.t(), K)
    if not (own_a and own_b):
        call.forget()       # a K-major copy: nothing a plan can name
    # the K-major operands are the arguments' own memory (a uint8 view, a transpose): launched as their pointers
    call.alias(a_km, a)
    call.alias(b_km, b)
    # the logical (row, k-block) views of the scales (the TMA kernel's launch copies those it cannot bulk-copy as they
    # are: a cost its tuning runs include)
    sa, sb = _scales(a_scale, b_scale, layout)
    call.alias(sa[0], a_scale)          # (a copy is not at its argument's address: no plan)
    call.alias(sb[0], b_scale)
    cfg = config_for(out, a_km, b_km, sa, sb, M, N, K, sb_rows, bool(trans_c), target)
    return _launch(cfg, out, a_km, b_km, sa, sb, M, N, K, sb_rows, bool(trans_c), call)


def _custom_op():
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor, layout: str, out_dtype: str,
             trans_c: bool) -> Tensor:
        return _run(UNRECORDED, a, a_scale, b, b_scale, layout, getattr(tm, out_dtype), None, trans_c)

    def fake(a, a_scale, b, b_scale, layout, out_dtype, trans_c):
        M = a.shape[0] if layout[0] == "N" else a.shape[1]
        N = b.shape[0] if layout[1] == "T" else b.shape[1]
        return a.new_empty((N, M) if trans_c else (M, N), dtype=getattr(tm, out_dtype))

    return impl, fake


@op(roles="TTTTOOTO", sources=(SRC, SRC_SM90, G.SRC), bench="gemm_fp8", custom_op=_custom_op)
def gemm_fp8_blockwise(call, a, a_scale, b, b_scale, *, layout="NT", out_dtype=None, out=None, trans_c=False):
    """Blockwise-scaled FP8 GEMM C = op(A) op(B) with 1 x 128 scales on A and 128 x 128 (or 1 x 128 per row) scales
    on B: layout "NT" (a [M, K], b [N, K]; forward), "NN" (a [M, K], b [K, N]; dgrad), "TN" (a [K, M], b [K, N];
    wgrad). Returns C [M, N] (C^T [N, M] with trans_c=True) in out_dtype (bfloat16 default, float16, float32).
    See rocjit.ops.gemm_fp8 for the scale shapes and the layout / tail decisions."""
    at, fw = C.to_torch(a, "a", NAME)
    bt = C.to_torch(b, "b", NAME)[0]
    sat = C.to_torch(a_scale, "a_scale", NAME)[0]
    sbt = C.to_torch(b_scale, "b_scale", NAME)[0]
    ot = C.torch_or_none(out, "out", NAME)
    if C.compiling():
        od = _check(at, sat, bt, sbt, layout, out_dtype, ot, trans_c)[4]
        y = C.into_out(gemm_fp8_blockwise.__rocjit_op__.torch_op()(at, sat, bt, sbt, layout,
                                                                   str(od).replace("torch.", ""), bool(trans_c)), ot)
    else:
        y = _run(call, at, sat, bt, sbt, layout, out_dtype, ot, trans_c)
    return call.done(C.to_caller(y, out, fw))
