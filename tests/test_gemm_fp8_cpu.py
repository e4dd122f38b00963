"""gemm_fp8_blockwise without a GPU: argument errors name the argument, the tile configs fit each target's shared
memory, and the kernel builds without spills using matrix instructions for sm_90a, gfx942 and gfx950."""
import json
import os
import re

import pytest

torch = pytest.importorskip("torch")
from rocjit.ops import gemm_fp8 as G  # noqa: E402

F8 = torch.float8_e4m3fn


def _args(M=64, N=32, K=256):
    a = torch.randn(M, K).to(F8)
    b = torch.randn(N, K).to(F8)
    return a, torch.ones(M, -(-K // 128)), b, torch.ones(-(-N // 128), -(-K // 128))


@pytest.mark.parametrize("change, exc, words", [
    (lambda a, sa, b, sb: (a, sa, b, sb, {"layout": "TT"}), ValueError, "layout"),
    (lambda a, sa, b, sb: (a, sa, b, sb, {"out_dtype": torch.int8}), TypeError, "out_dtype"),
    (lambda a, sa, b, sb: (a.float(), sa, b, sb, {}), TypeError, "a must have dtype"),
    (lambda a, sa, b, sb: (a, sa, b.view(torch.uint8), sb, {}), TypeError, "b must have dtype"),
    (lambda a, sa, b, sb: (a, torch.ones(64, 3), b, sb, {}), ValueError, "a_scale must have shape (64, 2)"),
    (lambda a, sa, b, sb: (a, sa.double(), b, sb, {}), TypeError, "a_scale must have dtype float32"),
    (lambda a, sa, b, sb: (a, sa, b, torch.ones(2, 2), {}), ValueError, "b_scale must have shape (1, 2)"),
    (lambda a, sa, b, sb: (a, sa, b[:, :128], sb, {}), ValueError, "K differ"),
    (lambda a, sa, b, sb: (a, sa, b, sb.t(), {"layout": "NN"}), ValueError, "K differ"),
    (lambda a, sa, b, sb: (a, sa, b, sb, {"out": torch.empty(3, 3, dtype=torch.bfloat16)}), ValueError, "out must"),
    (lambda a, sa, b, sb: (a, sa, b, sb, {}), ValueError, "must be on a GPU"),
])
def test_argument_errors_name_the_argument(change, exc, words):
    a, sa, b, sb, kw = change(*_args())
    with pytest.raises(exc, match=None) as e:
        G.gemm_fp8_blockwise(a, sa, b, sb, **kw)
    assert words in str(e.value) and "gemm_fp8_blockwise" in str(e.value)


def test_layout_shapes_are_read_per_layout():
    a, sa, b, sb = _args(M=64, N=200, K=384)
    # TN: a [K, M], b [K, N], a_scale [K/128, M], b_scale 128x128 [K/128, N/128] or per row [K/128, N]
    for bs in (torch.ones(3, 2), torch.ones(3, 200)):
        M, N, K, rows, od, shape = G._check(a.t(), sa.t(), b.t(), bs, "TN", None, None, True)
        assert (M, N, K, shape, od) == (64, 200, 384, (200, 64), torch.bfloat16) and rows == (bs.shape[1] == 200)


def test_every_config_fits_shared_memory_per_target():
    for target, limit in (("sm_90a", 227 * 1024), ("sm_89", 99 * 1024), ("gfx942", 64 * 1024), ("gfx950", 160 * 1024)):
        cands = G.candidates(target, limit)
        assert len(cands) >= 3, target      # gfx942 (64 KB of LDS) has no room for 128 x 128
        assert all(G.smem_bytes(c) <= limit for c in cands)
        for M, N in ((1, 7168), (4096, 4096), (128, 2112)):
            assert G.default_config(M, N, 132, cands) in cands


def test_kernel_builds_clean_with_matrix_instructions(tmp_path):
    from rocjit import check, toolchain
    from rocjit.platform import hip
    targets = ["sm_90a"]
    if toolchain.find() is not None and hip.hiprtc_usable():
        targets += ["gfx942", "gfx950"]
    elif os.environ.get("ROCJIT_REQUIRE_AMD") == "1":
        pytest.fail("ROCJIT_REQUIRE_AMD=1 but the AMD compilers are missing")
    out = tmp_path / "check.json"
    src = check.default_files()[0].parent / "gemm_fp8_blockwise.hip"
    rc = check.main(["--target", ",".join(targets), "--json", str(out), str(src)])
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["failures"] == []
    for t in targets:
        rows = [r for r in doc["rows"] if r["target"] == t]
        assert len(rows) >= 5 and all(r["status"] == "ok" for r in rows), t
        assert all(int(r["matrix"]) > 0 for r in rows), t


def test_wgmma_configs_only_on_sm90a_unless_turned_off(monkeypatch):
    for target in ("sm_89", "sm_90", "sm_100a", "gfx942"):
        assert not any(c.get("kernel") == "sm90" for c in G.candidates(target, 227 * 1024, sm90=True)), target
    monkeypatch.setenv("ROCJIT_GEMM_FP8_SM90", "0")
    assert not any(c.get("kernel") == "sm90" for c in G.candidates("sm_90a", 227 * 1024))
    monkeypatch.delenv("ROCJIT_GEMM_FP8_SM90", raising=False)
    assert G.candidates("sm_90a", 227 * 1024) == G.candidates("sm_90a", 227 * 1024, sm90=True)
    cands = G.candidates("sm_90a", 227 * 1024)
    wg = [c for c in cands if c.get("kernel") in ("sm90", "tma")]
    assert len(wg) >= 3 and all(G.smem_bytes(c) <= 227 * 1024 for c in wg)
    assert all(G.threads(c, "sm_90a") == (c["bm"] // 64 + c["ws"]) * 128 for c in wg if c["kernel"] == "sm90")
    # prefill-sized products take the TMA kernel by default (192-row tiles on three math warpgroups while every SM
    # gets one, then 256-row tiles on two), decode-sized ones the mma.sync kernel
    big = G.default_config(4096, 4096, 132, cands)
    assert big == {"kernel": "tma", "bm": 192, "bn": 128, "stages": 5, "pipe": False, "cluster": 1}
    assert G.default_config(4096, 2112, 132, cands)["bm"] == 192             # 22 x 17 tiles
    assert G.default_config(8192, 8192, 132, cands)["bm"] == 192
    cands3, cands = cands, [c for c in cands if c.get("bm") != 192]       # the two-warpgroup choices below
    assert G.default_config(4096, 4096, 132, cands) == {"kernel": "tma", "bm": 256, "bn": 128, "stages": 4,
                                                        "pipe": False, "cluster": 1}
    assert G.default_config(1024, 2112, 132, cands3) == G.default_config(1024, 2112, 132, cands)  # 6 x 17: too few
    assert G.default_config(1024, 2112, 132, cands)["bm"] == 128            # 4 x 17 256-row tiles: too few
    assert G.default_config(256, 256, 132, cands)["kernel"] == "tma"
    # at most 64 rows: a 64-row TMA tile, 64 x 128 where no split twin is offered: pipelined on one math warpgroup,
    # or on two taking turns over the K blocks where that twin is offered
    assert G.default_config(1, 7168, 132, cands) == {"kernel": "tma", "bm": 64, "bn": 128, "stages": 6, "pipe": False,
                                                     "cluster": 1, "kwg": 2}
    one = [c for c in cands if "kwg" not in c]
    assert G.default_config(1, 7168, 132, one) == {"kernel": "tma", "bm": 64, "bn": 128, "stages": 8, "pipe": True,
                                                   "cluster": 1}
    tma = [c for c in cands3 if c.get("kernel") == "tma" and "kwg" not in c]
    assert len(tma) == len(G._TMA_TILES)
    assert all(G.threads(c, "sm_90a") == {192: 512, 64: 256}.get(c["bm"], 384) for c in tma)
    # 64-row tiles of 2 or 3 math warpgroups taking turns over the K blocks: stages a multiple of them, and room for
    # the accumulators the others hand to the first
    kwg = [c for c in cands3 if "kwg" in c]
    assert len(kwg) == len(G._TMA_KWG_TILES)
    for c in kwg:
        assert c["kernel"] == "tma" and c["bm"] == 64 and c["stages"] % c["kwg"] == 0 and not c["pipe"]
        assert G.threads(c, "sm_90a") == 128 * (c["kwg"] + 1)
        assert G.smem_bytes(c) == G.smem_bytes({k: v for k, v in c.items() if k != "kwg"}) + \
            (c["kwg"] - 1) * 64 * c["bn"] * 4 <= 227 * 1024
    # the built-in rule takes them at most 64 rows only (twins of its one-warpgroup choices, tested below)
    for M, N, K in ((128, 4096, 7168), (65, 2112, 7168), (4096, 4096, 4096), (64, 2112, 7168), (1, 7168, 2048)):
        allc = cands3 + G.split_candidates(M, N, K, 132, cands3)
        assert ("kwg" in G.default_config(M, N, 132, allc, K)) == (M <= G.ROWS64_MAX_M), (M, N, K)
    assert {c["bm"] for c in tma} == {64, 128, 192, 256}
    assert {c["bn"] for c in tma} == {64, 128, 192}
    # the 128 x 192 tile where its last wave is much fuller (4096 x 2112: 3 rounds of 352 tiles against 3 rounds of
    # 272 twice as large), 256 x 128 where the rounds are even or 256 x 128 fills the GPU as well
    assert G.default_config(4096, 2112, 132, cands)["bn"] == 192
    for M, N in ((4096, 4096), (8192, 8192), (4096, 7168), (4096, 24576), (1024, 7168), (128, 4096)):
        assert G.default_config(M, N, 132, cands)["bn"] == 128, (M, N)
    assert G.default_config(1024, 2112, 132, cands)["pipe"]                # pipelined partials where offered
    # without the TMA kernel: the cp.async-fed wgmma kernel, as before
    monkeypatch.setenv("ROCJIT_GEMM_FP8_TMA", "0")
    cands = G.candidates("sm_90a", 227 * 1024)
    assert not any(c.get("kernel") == "tma" for c in cands)
    big = G.default_config(4096, 4096, 132, cands)
    assert big.get("kernel") == "sm90" and (big["bm"], big["bn"], big["ws"]) == (128, 256, False)
    assert G.default_config(4096, 2112, 132, cands)["bn"] == 256            # 32 x 9 tiles: still every SM busy
    assert (G.default_config(256, 256, 132, cands)["bm"], G.default_config(128, 7168, 132, cands)["bm"]) == (64, 64)


def test_split_k_twins_only_where_tiles_leave_multiprocessors_idle():
    cands = G.candidates("sm_90a", 227 * 1024)
    # 128 x 2112 x 7168: 17 tiles of 128 x 128 (7 ranges of 8 K blocks fill 119 of 132 SMs), 11 of 128 x 192 (12),
    # 33 of 128 x 64 (4)
    # (64-row tiles: 34 of 64 x 128 in 3 ranges, 66 of 64 x 64 in 2)
    split = G.split_candidates(128, 2112, 7168, 132, cands)
    assert {(c["bm"], c["bn"], c["pipe"], c["splits"]) for c in split} == {
        (128, 128, True, 7), (128, 128, True, 3), (128, 128, False, 7), (128, 128, False, 3), (128, 192, False, 12),
        (128, 192, False, 6), (128, 64, False, 4), (128, 64, False, 2),
        (64, 128, True, 3), (64, 128, False, 3), (64, 64, False, 2), (64, 64, True, 2)}
    assert all(c["kernel"] == "tma" and c["bm"] in (64, 128) and c["cluster"] == 1 for c in split)
    assert all(dict((k, v) for k, v in c.items() if k != "splits") in cands for c in split)
    # K unknown or longer than NARROW_MAX_KBLOCKS: the twin with the most work units, the wider tile on a tie (132 =
    # 11 x 12 = 33 x 4 against 119 = 17 x 7); at most 64 rows, of the 64-row tiles' twins: 64 x 7168 x 16384 on
    # 64 x 128 in 2 ranges (112 units), pipelined on one math warpgroup (the fastest one-warpgroup config there,
    # H200), on two taking turns where offered (faster still)
    one = [c for c in cands if "kwg" not in c]
    chosen = G.default_config(128, 2112, 132, cands + split)
    assert (chosen["bm"], chosen["bn"], chosen["splits"]) == (128, 192, 12)
    chosen = G.default_config(64, 7168, 132, one + G.split_candidates(64, 7168, 16384, 132, one), 16384)
    assert (chosen["bm"], chosen["bn"], chosen["splits"], chosen["pipe"]) == (64, 128, 2, True)
    chosen = G.default_config(64, 7168, 132, cands + G.split_candidates(64, 7168, 16384, 132, cands), 16384)
    assert (chosen["bm"], chosen["bn"], chosen["splits"], chosen["pipe"], chosen["kwg"]) == (64, 128, 2, False, 2)
    # K of at most NARROW_MAX_KBLOCKS blocks: the fewest ranges within SPLIT_UNITS_BAND of the most units, the unsplit
    # 128 x 64 tile counted where its tiles fit one round (H200 measurements at SPLIT_UNITS_BAND)
    chosen = G.default_config(128, 2112, 132, cands + split, 7168)               # 132 units in 4 ranges
    assert (chosen["bn"], chosen["splits"]) == (64, 4)
    chosen = G.default_config(128, 4096, 132, cands + G.split_candidates(128, 4096, 7168, 132, cands), 7168)
    assert (chosen["bn"], chosen["splits"]) == (64, 2)                           # 128 units: 64 x 2, not 32 x 4
    for M, N in ((128, 7168), (256, 4096)):                                      # 112 / 128 tiles of 128 x 64: unsplit
        chosen = G.default_config(M, N, 132, cands + G.split_candidates(M, N, 2048, 132, cands), 2048)
        assert chosen["bn"] == 64 and "splits" not in chosen and chosen["kernel"] == "tma", (M, N)
        assert not chosen["pipe"]           # 64 columns: the rule's measured choice, without pipelined partials
    # 128 x 5000 x 4096: 79 tiles of 128 x 64 (60% of the units of 128 x 128 in 3 ranges): a split 128-column twin
    chosen = G.default_config(128, 5000, 132, cands + G.split_candidates(128, 5000, 4096, 132, cands), 4096)
    assert chosen["bn"] == 128 and chosen["splits"] == 3 and chosen["pipe"]
    # at most 64 rows, K of at most NARROW_MAX_KBLOCKS blocks: the same rule over the 64-row tiles' twins and their
    # unsplit tiles that fit one round (H200, the fastest config at each): 64 x 7168 x 2048 unsplit 64 x 64 (112 units,
    # as many as 64 x 128 in 2 ranges); 64 x 2112 x 7168 64 x 64 in 4 (132; 64 x 128 in 7: 119); 64 x 4096 x 7168
    # 64 x 64 in 2 (128, as 64 x 128 in 4); 40 x 24576 x 1536, 192 tiles of 64 x 128: that tile unsplit, pipelined;
    # each on two math warpgroups taking turns where that twin is offered (same tile and ranges, no pipelining)
    for (M, N, K), want in (((64, 7168, 2048), (64, 1)), ((64, 2112, 7168), (64, 4)), ((64, 4096, 7168), (64, 2)),
                            ((40, 24576, 1536), (128, 1))):
        chosen = G.default_config(M, N, 132, one + G.split_candidates(M, N, K, 132, one), K)
        assert (chosen["kernel"], chosen["bm"], chosen["bn"], chosen.get("splits", 1)) == ("tma", 64) + want, (M, N)
        assert chosen["pipe"] == (chosen["bn"] == 128) and "kwg" not in chosen, (M, N)
        twin = G.default_config(M, N, 132, cands + G.split_candidates(M, N, K, 132, cands), K)
        assert twin == dict(chosen, pipe=False, stages=twin["stages"], kwg=2) and twin in \
            cands + G.split_candidates(M, N, K, 132, cands), (M, N)
    assert G.default_config(40, 24576, 132, one, 1536)["pipe"]
    assert G.default_config(40, 24576, 132, cands, 1536)["kwg"] == 2
    # above 64 rows never (not offered there: no such tile was the fastest config at M = 128)
    assert "kwg" not in G.default_config(65, 2112, 132, cands + G.split_candidates(65, 2112, 7168, 132, cands), 7168)
    # 65 rows: the 128-row tiles' rule (128 x 64 in 4 ranges at 65 x 2112 x 7168)
    chosen = G.default_config(65, 2112, 132, cands + G.split_candidates(65, 2112, 7168, 132, cands), 7168)
    assert (chosen["bm"], chosen["bn"], chosen["splits"]) == (128, 64, 4)
    # ranges of at least SPLIT_MIN_KBLOCKS K blocks: 8 K blocks leave 2 ranges; 4 leave none worth the reduce
    assert {c["splits"] for c in G.split_candidates(77, 300, 1024, 132, cands)} == {2}
    assert G.split_candidates(128, 2112, 512, 132, cands) == []
    # more than half the multiprocessors busy already: none (4096^3; 256 x 7168: 112 tiles of 128 x 128, 76 of 192)
    assert G.split_candidates(4096, 4096, 4096, 132, cands) == []
    assert G.split_candidates(256, 7168, 16384, 132, cands) == []
    assert G.smem_bytes(split[0]) == G.smem_bytes({k: v for k, v in split[0].items() if k != "splits"})


def test_tail_split_twins_where_the_last_round_is_at_most_half_full():
    cands = G.candidates("sm_90a", 227 * 1024)
    # TN 4096 x 4096 x 7168 (56 K blocks): 192 x 128 -> 704 tiles, 44 in the last round -> 3 ranges; 128 x 128 ->
    # 1024 tiles, 100 left (more than half): none; 256 x 128 -> 512, 116 left: none; 128 x 192 -> 704, 44: 3
    tail = G.tail_candidates(4096, 4096, 7168, 132, cands)
    assert {(c["bm"], c["bn"], c["tail"]) for c in tail} == {(192, 128, 3), (128, 192, 3)}
    assert all(c["kernel"] == "tma" and c["cluster"] == 1 and "splits" not in c for c in tail)
    assert all(dict((k, v) for k, v in c.items() if k != "tail") in cands for c in tail)
    # K ranges of at least SPLIT_MIN_KBLOCKS K blocks: K = 1024 (8 blocks) allows 2
    assert {c["tail"] for c in G.tail_candidates(4096, 4096, 1024, 132, cands)} == {2}
    # fewer tiles than multiprocessors (split-K's case), or whole rounds: none
    assert G.tail_candidates(128, 2112, 7168, 132, cands) == []
    assert G.tail_candidates(4224, 4096, 7168, 132, [c for c in cands if c.get("bm") == 192]) != []
    assert G.tail_candidates(132 * 192, 128, 7168, 132, cands) == [] or \
        all(c["bm"] != 192 for c in G.tail_candidates(132 * 192, 128, 7168, 132, cands))
    # the default: the 192 x 128 tile's twin where its ranges are long enough (K given), else the unsplit tile
    three = G.default_config(4096, 4096, 132, cands)
    assert three["bm"] == 192 and "tail" not in three
    assert G.default_config(4096, 4096, 132, cands + tail) == three                  # K unknown
    assert G.default_config(4096, 4096, 132, cands + tail, 7168) == dict(three, tail=3)   # 56 K blocks: ranges of 19
    assert G.default_config(4096, 4096, 132, cands, 7168) == three                  # no twin offered
    for K in (4096, 2048):                                                          # ranges of 11, 6 K blocks
        short = G.tail_candidates(4096, 4096, K, 132, cands)
        assert any(c["bm"] == 192 for c in short)
        assert G.default_config(4096, 4096, 132, cands + short, K) == three
    assert G.default_config(4096, 4096, 132, cands + G.tail_candidates(4096, 4096, 6144, 132, cands), 6144) == \
        dict(three, tail=3)                                                         # 48 K blocks: ranges of 16
    # M = 3840: 640 tiles of 192 x 128 = 4 x 132 + 112, the last round more than half full: no twin to take
    assert "tail" not in G.default_config(3840, 4096, 132, cands + G.tail_candidates(3840, 4096, 7168, 132, cands), 7168)
    assert G.smem_bytes(tail[0]) == G.smem_bytes({k: v for k, v in tail[0].items() if k != "tail"})


def test_wgmma_kernel_builds_clean_for_sm90a(tmp_path):
    """Every checked instantiation of the wgmma kernel: no spills, warpgroup MMAs in the SASS, registers that let
    one block of its largest config run per multiprocessor, and each tuner candidate's template built."""
    from rocjit import check
    src = check.default_files()[0].parent / G.SRC_SM90
    out = tmp_path / "check.json"
    rc = check.main(["--target", "sm_90a", "--json", str(out), str(src)])
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["failures"] == []
    rows = doc["rows"]
    assert len(rows) >= 5 and all(r["status"] == "ok" for r in rows)
    sums = [r for r in rows if r["kernel"].startswith("gemm_fp8_splitk_sum")]    # split-K's second kernel
    assert len(sums) == 5 and all(int(r["registers"]) <= 64 for r in sums)
    moves = [r for r in rows if r["kernel"].startswith("gemm_fp8_scales_kblock_rows")]    # the scale layout's copy
    assert len(moves) == 1 and int(moves[0]["registers"]) <= 64
    tails = [r for r in rows if r["kernel"].startswith("gemm_fp8_tail_sum")]      # the tail split's second kernel
    assert len(tails) == 3 and all(int(r["registers"]) <= 64 and r["spills"]["stores"] == 0 for r in tails)
    rows = [r for r in rows if r not in sums and r not in moves and r not in tails]
    assert all(int(r["matrix"]) >= 4 for r in rows)          # 4 k32 steps of m64n128k32 per K block
    for r in rows:
        if "_tma" in r["kernel"]:   # 384 / 512 threads (setmaxnreg moves registers between the warpgroups); 256
            nthreads = 512 if "_tma3" in r["kernel"] else 256 if "_tma1" in r["kernel"] else 384
            if "_tmak" in r["kernel"]:                                       # 128 x (KWG + 1)
                nthreads = 128 * (int(re.search(r"<[^,]+, (\d+),", r["kernel"]).group(1)) + 1)
            assert int(r["registers"]) * nthreads <= 65536, r
            continue
        bm, ws = re.search(r"<[^,]+, (\d+), \d+, \d+, (true|false),", r["kernel"]).groups()
        assert int(r["registers"]) * (int(bm) // 64 + (ws == "true")) * 128 <= 65536, r
    assert {r["kernel"].split("<")[0] for r in rows} >= {"gemm_fp8_blockwise_tma_kernel", "gemm_fp8_blockwise_tma2_kernel"}
    text = src.read_text()
    for c in G.candidates("sm_90a", 227 * 1024, sm90=True):
        if c.get("kernel") == "sm90":
            assert f", {c['bm']}, {c['bn']}, {c['stages']}, {'true' if c['ws'] else 'false'}," in text, c
        elif c.get("kernel") == "tma" and c["bm"] == 192:
            assert f"gemm_fp8_blockwise_tma3_kernel<__hip_bfloat16, {c['stages']}," in text, c
        elif "kwg" in c:
            assert f"gemm_fp8_blockwise_tmak_kernel<__hip_bfloat16, {c['kwg']}, {c['bn']}, {c['stages']}," in text, c
        elif c.get("kernel") == "tma" and c["bm"] == 64:
            assert re.search(rf"gemm_fp8_blockwise_tma1_kernel<[^,]+, {c['bn']}, {c['stages']}, "
                             rf"{'true' if c['pipe'] else 'false'},", text), c
        elif c.get("kernel") == "tma":
            kname = "gemm_fp8_blockwise_tma2_kernel" if c["cluster"] == 2 else "gemm_fp8_blockwise_tma_kernel"
            assert re.search(rf"{kname}<[^,]+, {c['bm'] // 128}, {c['bn']}, {c['stages']}, "
                             rf"{'true' if c['pipe'] else 'false'},", text), c


def test_tuning_keys_hold_the_exact_weight_shape():
    from rocjit import tune
    from rocjit.ops import gemm_fp8
    assert gemm_fp8.tune_bucket(4096, 4096, 7168) == "m4096_n4096_k7168"
    assert gemm_fp8.tune_bucket(4096, 2112, 7168) == "m4096_n2112_k7168"
    assert gemm_fp8.tune_bucket(16, 4096, 7168) == tune.weight_bucket(m=16, n=4096, k=7168) == "m16_n4096_k7168"
    assert gemm_fp8.tune_bucket(9, 4096, 7168) == "m16_n4096_k7168"


def test_products_are_tuned_on_graph_replays(monkeypatch):
    """Events around calls timed the host's launch path wherever it outlasts the kernel (H200 at M = 128: the op
    picked a 25 us tile where a 12 us one exists; at 4096^3 the TMA kernel's 130 us Python path hid the tiles'
    differences), so every size is timed as CUDA-graph replays: below 2^34 FLOP over rotated copies of b, above
    over b itself. Winners timed otherwise are tuned again (the timing method is part of src_hash)."""
    from rocjit import tune
    from rocjit.ops import _gemm
    used = []
    monkeypatch.setattr(_gemm, "_device", lambda dev: ("sm_90a", "fake GPU", 132))
    monkeypatch.setattr(G, "_smem_limit", lambda dev: 227 * 1024)
    monkeypatch.setattr(G, "_launch", lambda *a, **k: None)
    monkeypatch.setattr(tune, "rotation_copies", lambda t: [t, t])
    monkeypatch.setattr(tune, "time_graph", lambda fns, **k: used.append(("graph", len(fns))) or 1.0)
    monkeypatch.setattr(tune, "time_gpu", lambda fn, **k: used.append(("events", 1)) or 1.0)
    monkeypatch.setattr(tune, "pick", lambda *a, bench, candidates, **k: bench(candidates[0]) and candidates[0])
    c, u8 = torch.empty(1, 1, dtype=torch.bfloat16), torch.empty(1, 1, dtype=torch.uint8)
    for (M, N, K), want in (((128, 7168, 2048), ("graph", 2)), ((64, 24576, 1536), ("graph", 2)),
                            ((4096, 4096, 4096), ("graph", 1))):
        used.clear()
        G._config_for(c, u8, torch.empty(N, K, dtype=torch.uint8), None, None, M, N, K, False, False, "sm_90a", 0)
        assert used == [want], (M, N, K, used)
    before = G.src_hash()
    G.src_hash.cache_clear()
    monkeypatch.setattr(G, "TUNE_TIMING", G.TUNE_TIMING + " (changed)")
    assert G.src_hash() != before
    G.src_hash.cache_clear()


def test_split_k_configs_count_their_reduce_launch():
    from rocjit.ops import _gemm as G
    assert G.launches({"path": "mma", "splits": 1}) == 1 and G.launches({"path": "stream"}) == 1
    assert G.launches({"path": "mma", "splits": 3}) == 2


def test_config_choice_is_remembered_until_what_it_depends_on_changes(monkeypatch):
    """The TMA kernel records no eager plan, so config_for runs on every call: it answers from its memo once
    tune.pick has settled, and asks again after tune.clear_memory(), a changed kernel switch, or with autotuning
    turned on or off; a choice made under graph capture (a default pick() does not remember) is not kept."""
    from rocjit import tune
    calls = []

    def fake(c, a_km, b_km, sa, sb, M, N, K, sb_rows, trans_c, target, dev):
        calls.append((M, N, K, sb_rows))
        return {"n": len(calls)}
    monkeypatch.setattr(G, "_config_for", fake)
    monkeypatch.setattr(G, "_CONFIGS", {})
    monkeypatch.delenv("ROCJIT_GEMM_FP8_TMA", raising=False)
    monkeypatch.delenv("ROCJIT_AUTOTUNE", raising=False)
    c, a = torch.empty(4, 4, dtype=torch.bfloat16), torch.empty(4, 4, dtype=torch.uint8)
    ask = lambda M=4096, rows=False: G.config_for(c, a, a, None, None, M, 4096, 4096, rows, False, "sm_90a")  # noqa: E731
    assert ask() == ask() == {"n": 1} and len(calls) == 1
    assert ask(M=4095) == {"n": 2} and ask(rows=True) == {"n": 3} and len(calls) == 3
    tune.clear_memory()
    assert ask() == {"n": 4}
    monkeypatch.setenv("ROCJIT_GEMM_FP8_TMA", "0")
    assert ask() == {"n": 5} and ask() == {"n": 5}
    monkeypatch.setenv("ROCJIT_AUTOTUNE", "0")
    assert ask() == {"n": 6}
    monkeypatch.setattr(tune, "capturing", lambda: True)
    assert ask(M=8) == {"n": 7} and ask(M=8) == {"n": 8}


def test_pipelined_tma_kernel_keeps_its_wgmmas_asynchronous():
    """ptxas serializes every wgmma of a kernel when it sees an accumulator register read while a wgmma owns it
    (message C7514, e.g. a compiler copy of an in-flight partial set): the pipelined-partials TMA kernel exists to
    overlap K block kb + 1's wgmmas with kb's promotion, so its build must not carry that message."""
    try:
        from rocjit.compilers import nvrtc
        nvrtc._nvrtc()
    except Exception as e:
        pytest.skip(f"NVRTC is not usable here: {e}")
    from rocjit.compiler import kernels_src_dir
    from rocjit.kernel import Module
    names = [f"gemm_fp8_blockwise_{k}<__hip_bfloat16, {slabs}, {bn}, {st}, {pipe}, false, false, true>"
             for k, slabs, bn, st, pipe in (("tma_kernel", 1, 128, 6, "true"), ("tma2_kernel", 1, 128, 6, "true"),
                                            ("tma_kernel", 2, 128, 4, "false"), ("tma_kernel", 1, 192, 5, "false"))]
    names.append("gemm_fp8_blockwise_tma_kernel<__hip_bfloat16, 1, 128, 6, true, true, false, true>")  # per-row B scales
    names += [f"gemm_fp8_blockwise_tma1_kernel<__hip_bfloat16, {bn}, {st}, true, {sb_rows}, false, true>"  # one warpgroup
              for bn, st in ((128, 8), (64, 12)) for sb_rows in ("false", "true")]
    names += [f"gemm_fp8_blockwise_tma_kernel<__hip_bfloat16, 1, 64, 8, true, {sb_rows}, false, true>"   # m64n64k32
              for sb_rows in ("false", "true")]
    mod = Module(kernels_src_dir() / G.SRC_SM90, options=["--ptxas-options=-v"])
    log = mod.compile("sm_90a", name_expressions=names).log
    assert "Compiling entry function" in log            # the log is ptxas' verbose report
    bad = [line for line in log.splitlines() if re.search(r"C751[0-9]|serializ", line)]
    assert not bad, "\n".join(bad)
    assert not re.search(r"[1-9]\d* bytes spill", log), log


def test_bench_times_a_shapes_implementations_in_alternating_rounds(monkeypatch):
    """bench gemm_fp8 times every implementation of a large shape once per round, all of them in turn, the order
    reversed every other round, and reports each one's median over the rounds."""
    from rocjit.bench import gemm_fp8 as B
    calls = []
    fake = {"a": [5.0, 1.0, 3.0], "b": [2.0, 9.0, 4.0], "c": [7.0, 7.0, 1.0]}

    def time_graph(fns, reps, warmup, keep=None):
        name = fns[0]()
        calls.append(name)
        return fake[name][sum(1 for c in calls if c == name) - 1]
    monkeypatch.setattr(B.H, "time_graph", time_graph)
    monkeypatch.setattr(B.H, "time_rotating", lambda *a, **k: pytest.fail("large shapes are graph-timed"))
    monkeypatch.setattr(B, "ROUNDS", 3)
    events = set()
    got = B._time_all({k: [lambda k=k: k] for k in "abc"}, 4096, events)
    assert calls == list("abc") + list("cba") + list("abc")
    assert got == {"a": 3.0, "b": 4.0, "c": 7.0} and events == set()
    calls.clear()                                   # rounds of their own (the diagnostic rows): as many as asked
    fake.update(a=[5.0, 1.0], b=[2.0, 9.0])
    assert B._time_all({k: [lambda k=k: k] for k in "ab"}, 4096, events, rounds=2) == {"a": 3.0, "b": 5.5}
    assert calls == list("ab") + list("ba")


@pytest.mark.parametrize("M", [128, 4096])
def test_bench_times_with_events_only_where_capture_fails_and_says_so(monkeypatch, M):
    """Every size is timed as graph replays (events timed the op's host launch path wherever it outlasted the
    kernel); an implementation whose capture fails falls back to events, its key recorded and a note written once."""
    from rocjit.bench import gemm_fp8 as B

    def time_graph(fns, reps, warmup, keep=None):
        if fns[0]() == "uncapturable":
            raise RuntimeError("operation not permitted when stream is capturing")
        return 1.0
    monkeypatch.setattr(B.H, "time_graph", time_graph)
    monkeypatch.setattr(B.H, "time_rotating", lambda fns, graph, reps=50: 2.0)
    monkeypatch.setattr(B, "ROUNDS", 3)
    events, result = set(), {}
    got = B._time_all({k: [lambda k=k: k] for k in ("fine", "uncapturable")}, M, events, result)
    assert got == {"fine": 1.0, "uncapturable": 2.0} and events == {"uncapturable"}
    assert len(result["notes"]) == 1 and "uncapturable" in result["notes"][0] and "events" in result["notes"][0]


def test_decode_candidates_cover_small_m_on_nvidia_only():
    """The decode kernel (rocjit.ops.skinny's matrix-core kernel with blockwise scales) is offered for M <= 32 rows
    on NVIDIA with FP8 matrix cores, for B scales per 128 x 128 tile and C not transposed; its configs step over whole
    128-wide K blocks (UNROLL even) without the 4-blocks-per-SM bound; the default is among them."""
    for M in (1, 2, 5, 8, 9, 16, 17, 32):
        cands = G.decode_candidates("sm_90a", M, 7168, 16384, 132, False, False)
        assert len(cands) >= 4 and all(c["kernel"] == "skinny_mma" for c in cands), M
        assert all(c["unroll"] % 2 == 0 and "minb" not in c for c in cands)
        assert G.decode_default(M, 7168, 16384, 132, cands) in cands
    assert G.decode_candidates("sm_89", 4, 7168, 16384, 128, False, False)
    for args in (("sm_90a", 33, 7168, 16384, 132, False, False), ("sm_90a", 4, 7168, 16384, 132, True, False),
                 ("sm_90a", 4, 7168, 16384, 132, False, True), ("sm_80", 4, 7168, 16384, 108, False, False),
                 ("gfx942", 4, 7168, 16384, 304, False, False)):
        assert G.decode_candidates(*args) == [], args


@pytest.mark.parametrize("tokens, k_in, n_out", [(8192, 4096, 14336), (1000, 4096, 14336), (384, 1536, 4096)])
def test_fp8_linear_scales_reach_the_tma_kernel_without_a_copy(tokens, k_in, n_out):
    """FP8Linear hands every GEMM its scales as the quantizers return them (quantize_fp8_dual's s_row, and with
    transpose_col=True its s_col, passed through .t() views as rocjit.nn does); the TMA kernel bulk-copies each K
    block's scales from M-major memory, so none of the three products may need the copy _k_block_rows makes for
    other layouts (one gather kernel per call, gemm_fp8_scales_kblock_rows). Layouts from the quantizers' fake implementations, which allocate as
    the real ones do."""
    from rocjit.ops import quant
    fake_dual = quant._dual_op()[1]
    fmt = "e4m3fn"
    x = torch.empty(tokens, k_in, dtype=torch.bfloat16)
    gy = torch.empty(tokens, n_out, dtype=torch.bfloat16)
    _, xs, _, xs_t = fake_dual(x, fmt, True)
    _, gs, _, gs_t = fake_dual(gy, fmt, True)

    def untouched(s, rows, K):
        return G._k_block_rows(s, rows, K)[0] is s[0]

    # forward NT: a = x [tokens, k_in], per-row A scales xs; B scales per 128 x 128 tile (not bulk-copied per row)
    sa, _ = G._scales(xs, torch.ones(-(-n_out // 128), -(-k_in // 128)), "NT")
    assert untouched(sa, tokens, k_in)
    # dgrad NN: a = dy [tokens, n_out], per-row A scales gs
    sa, _ = G._scales(gs, torch.ones(-(-n_out // 128), -(-k_in // 128)).t(), "NN")
    assert untouched(sa, tokens, n_out)
    # wgrad TN: a = dy as [K = tokens, M = n_out] (a_scale gs_t.t()), b = x as [K = tokens, N = k_in] with per-row B
    # scales (b_scale xs_t.t())
    sa, sb = G._scales(gs_t.t(), xs_t.t(), "TN")
    assert untouched(sa, n_out, tokens) and untouched(sb, k_in, tokens)
    # and a layout that is not M-major is copied (the check can fail)
    rowmajor = torch.ones(n_out, -(-tokens // 128))
    assert not G._bulk_ready(G._scales(rowmajor.t(), xs_t.t(), "TN")[0], n_out)


@pytest.mark.parametrize("M, sets", [(1, 5), (128, 5), (256, 5), (4096, 1)])
def test_bench_streams_the_weights_of_decode_sized_products(M, sets):
    """Products of <= 256 rows run over copies of the weight whose one pass exceeds twice the L2 (2112 x 7168: 15 MB
    in FP8, 30 MB in bf16, an L2 of 50 MB: 5 sets), each with its own memory and the same values; larger ones over
    the weight itself."""
    from rocjit.bench import gemm_fp8 as B
    N, K = 2112, 7168
    w = torch.randn(N, K, dtype=torch.bfloat16)
    wq, ws = w.to(F8), torch.rand(-(-N // 128), -(-K // 128))
    qsets, wts = B._weight_sets(w, wq, ws, M, N, K, l2_bytes=50 << 20)
    assert len(qsets) == len(wts) == sets
    assert qsets[0][0] is wq and qsets[0][1] is ws
    assert len({q.data_ptr() for q, _ in qsets}) == len({sc.data_ptr() for _, sc in qsets}) == sets
    assert len({t.data_ptr() for t in wts}) == sets
    for q, sc in qsets:
        assert torch.equal(q.view(torch.uint8), wq.view(torch.uint8)) and torch.equal(sc, ws)
    for t in wts:      # K-major: the bf16 peer multiplies by t.t(), a contiguous [K, N]
        assert torch.equal(t, w) and t.t().is_contiguous()


class _Recorder:
    """Stand-ins for rocjit.nn's quantizers and GEMM on the CPU that record what the layers ask for: which copies
    (the column blocks, W's transposed copy) and which products. Shapes and layouts as the real ops return them."""

    def __init__(self, monkeypatch):
        from rocjit import nn as rnn
        self.calls = []
        monkeypatch.setattr(rnn, "quantize_fp8_dual", self.dual)
        monkeypatch.setattr(rnn, "quantize_fp8_weight", self.weight)
        monkeypatch.setattr(rnn, "gemm_fp8_blockwise", self.gemm)

    def dual(self, x, *, transpose_col=False, activation=None, grad=None, columns=True):
        assert not transpose_col or columns
        self.calls.append(("dual", columns, activation, grad is not None))
        M, K = x.shape
        s_row = torch.rand(-(-K // 128), M).t()
        if not columns:
            return x.clone(), s_row, None, None
        return x.clone(), s_row, x.t().contiguous(), torch.rand(-(-M // 128), K).t()

    def weight(self, w, *, transposed=False):
        self.calls.append(("weight", transposed))
        s = torch.rand(-(-w.shape[0] // 128), -(-w.shape[1] // 128))
        return (w.clone(), s, w.t().contiguous()) if transposed else (w.clone(), s)

    def gemm(self, a, a_s, b, b_s, *, layout, out_dtype):
        self.calls.append(("gemm", layout))
        M = a.shape[1] if layout == "TN" else a.shape[0]
        N = b.shape[0] if layout == "NT" else b.shape[1]
        return torch.randn(M, N, dtype=out_dtype)

    def take(self):
        calls, self.calls = self.calls, []
        return calls


@pytest.mark.parametrize("grad_mode, x_grad, w_grad", [(False, True, True), (True, False, False),
                                                       (True, True, False), (True, False, True),
                                                       (True, True, True)])
def test_fp8_linear_makes_only_the_copies_its_backward_reads(monkeypatch, grad_mode, x_grad, w_grad):
    """The forward quantizes x with column blocks only for wgrad (the weight takes a gradient) and W with its
    transposed copy only for dgrad (x takes one); inference (no grad mode) makes neither. The backward runs only the
    products asked for, and quantizes dy's column blocks only for wgrad."""
    from rocjit.nn import FP8Linear
    rec = _Recorder(monkeypatch)
    layer = FP8Linear(256, 384, bias=False).requires_grad_(w_grad)
    x = torch.randn(2, 100, 256).to(torch.bfloat16).requires_grad_(x_grad)
    with torch.set_grad_enabled(grad_mode):
        y = layer(x)
    assert y.shape == (2, 100, 384)
    need_x, need_w = grad_mode and x_grad, grad_mode and w_grad
    assert rec.take() == [("dual", need_w, None, False), ("weight", need_x), ("gemm", "NT")]
    if not (need_x or need_w):
        assert not y.requires_grad
        return
    y.backward(torch.randn_like(y))
    assert rec.take() == [("dual", need_w, None, False)] + [("gemm", "NN")] * need_x + [("gemm", "TN")] * need_w
    assert (x.grad is not None) == need_x and (x.grad is None or x.grad.shape == x.shape)
    assert (layer.weight.grad is not None) == need_w


@pytest.mark.parametrize("grad_mode, x_grad, fc1_grad, fc2_grad, activation", [
    (False, True, True, True, "gelu"), (True, False, False, False, "gelu"), (True, True, False, False, "relu"),
    (True, False, False, True, "silu"), (True, False, True, False, "relu"), (True, True, True, True, "gelu")])
def test_fp8_mlp_makes_only_the_copies_its_backward_reads(monkeypatch, grad_mode, x_grad, fc1_grad, fc2_grad,
                                                         activation):
    """FP8MLP: each Linear's copies as FP8Linear's, where 'x takes a gradient' for fc2 means anything below it
    does; only fc2 trainable: no pass through fc2's dgrad or the activation's backward."""
    from rocjit import nn as rnn
    rec = _Recorder(monkeypatch)
    mlp = rnn.FP8MLP(256, 384, 128, bias=False, activation=activation)
    mlp.fc1.requires_grad_(fc1_grad)
    mlp.fc2.requires_grad_(fc2_grad)
    x = torch.randn(200, 256).to(torch.bfloat16).requires_grad_(x_grad)
    with torch.set_grad_enabled(grad_mode):
        y = mlp(x)
    need_x, need_w1, need_w2 = (grad_mode and g for g in (x_grad, fc1_grad, fc2_grad))
    below = need_x or need_w1
    assert rec.take() == [("dual", need_w1, None, False), ("weight", need_x), ("gemm", "NT"),
                          ("dual", need_w2, activation, False), ("weight", below), ("gemm", "NT")]
    if not (below or need_w2):
        assert not y.requires_grad
        return
    y.backward(torch.randn_like(y))
    calls = rec.take()
    expect = [("dual", need_w2, None, False)] + [("gemm", "TN")] * need_w2
    if below:
        fused = activation in rnn._FUSED_BACKWARD      # no bias: the activation's backward in the quantizer
        expect += [("gemm", "NN"), ("dual", need_w1, activation if fused else None, fused)]
        expect += [("gemm", "NN")] * need_x + [("gemm", "TN")] * need_w1
    assert calls == expect
    assert (x.grad is not None) == need_x
    assert (mlp.fc1.weight.grad is not None) == need_w1 and (mlp.fc2.weight.grad is not None) == need_w2


def test_rows_only_quantization_keeps_the_dual_row_layout():
    """quantize_fp8_dual(columns=False)'s custom op (what torch.compile traces) allocates the row outputs as the
    dual call does (s_row M-major, the layout the TMA kernel bulk-copies) and empty column outputs, which the
    public function returns as None."""
    from rocjit.ops import quant
    fake = quant._dual_op()[1]
    x = torch.empty(300, 264, dtype=torch.bfloat16)
    q, s, qc, sc = fake(x, "e4m3fn", False, "gelu", None, False)
    rq, rs, *_ = fake(x, "e4m3fn", True)
    assert q.shape == rq.shape and q.dtype == rq.dtype
    assert s.shape == rs.shape == (300, 3) and s.stride() == rs.stride() == (1, 300)
    assert qc.numel() == 0 and sc.numel() == 0
