"""Decode attention against a key / value cache, grouped-query heads (kernels_src/decode_attention.hip).

    out = decode_attention(q, k, v)                  # q [B, Hq, S, D]; k, v [B, Hkv, L, D] -> out [B, S, Hq, D]
    out = decode_attention(q, k, v, mask)            # bool (True: attend) or additive in q's dtype, broadcastable
                                                     # to [B, Hq, S, L]
    out = decode_attention(q, k, v, causal=True)     # query s of S sees keys 0 .. L - S + s

softmax(q kᵀ · scale + mask) v in fp32, ``scale`` 1/sqrt(D) unless given; Hq a multiple of Hkv (query head h reads
key / value head h // (Hq / Hkv)). Written for few query rows per sequence (decode, speculative steps): each
block reads a key / value head once for all the query rows that share it, and long caches are split across
blocks whose partial softmaxes a second kernel merges. q, k and v may have any strides with a contiguous last
dimension (a static cache's tensors, a transposed q); the output is contiguous [B, S, Hq, D], which an output
projection reads as [B, S, Hq * D]. Rows whose keys are all masked get zeros. D is a multiple of 8, at most 256.

    out = decode_attention_rope(q, k, v, cos, sin, k_cache, v_cache, position, mask)

One decode step of a rotary model in one kernel: q [B, Hq, 1, D] and the new key / value [B, Hkv, 1, D] as the
projections made them, cos / sin [B or 1, 1, D] (the rotate-half convention of Llama, Mistral, Qwen: x cos +
rotate_half(x) sin, rotate_half(x) = [-x[D/2:], x[:D/2]]). The kernel rotates q and the key, writes the key and v
into the caches [B, Hkv, L, D] at `position` (an int64 tensor of one element on the GPU, read there: no host
sync), and attends q over the updated cache with the mask as decode_attention. A position outside 0 .. L - 1
writes nothing and gives NaN outputs (the kernel cannot raise). D is a multiple of 16. advance=True: the kernel
also adds one to `position` once every block has read it (what a static cache layer's length does after its
update), so a decode step needs no separate kernel for that; the position must then lie in int32 range.
"""
from typing import Optional

from rocjit.ops import _common as C
from rocjit.ops._op import UNRECORDED, op

_SRC = "decode_attention.hip"
_MAX_STRIDE = 2 ** 31 - 1


def _check(name, q, k, v, mask):
    C.check_tensor(name, "q", q, dtypes=C.half_dtypes(), dim=4, contiguous=False)
    if not q.is_cuda:
        raise ValueError(f"{name}: q must be on a GPU, got {q.device}")
    B, Hq, S, D = q.shape
    C.check_tensor(name, "k", k, dtypes=(q.dtype,), dim=4, device=q.device, contiguous=False)
    C.check_tensor(name, "v", v, dtypes=(q.dtype,), dim=4, device=q.device, contiguous=False)
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"{name}: k must be [B, Hkv, L, D] = [{B}, Hkv, L, {D}] for q {tuple(q.shape)}, "
                         f"got {tuple(k.shape)}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"{name}: v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    hkv = k.shape[1]
    if hkv == 0 or Hq % hkv:
        raise ValueError(f"{name}: q's {Hq} heads must be a multiple of k's {hkv} key / value heads")
    if D % 8 or not 8 <= D <= 256:
        raise ValueError(f"{name}: the head dimension must be a multiple of 8 in 8..256, got {D}")
    for n, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(3) != 1 and t.shape[3] > 1:
            raise ValueError(f"{name}: {n} must have a contiguous last dimension, got strides {t.stride()}")
    if mask is not None:
        C.check_tensor(name, "mask", mask, dtypes=(C.torch().bool, q.dtype), device=q.device, contiguous=False)
        want = (B, Hq, S, k.shape[2])
        if mask.dim() > 4 or any(m not in (1, w) for m, w in zip(mask.shape[::-1], want[::-1])):
            raise ValueError(f"{name}: mask must broadcast to [B, Hq, S, L] = {list(want)}, got {tuple(mask.shape)}")
    for n, t in (("q", q), ("k", k), ("v", v), ("mask", mask)):
        if t is not None and any(abs(s) > _MAX_STRIDE for s in t.stride()):
            raise ValueError(f"{name}: {n} has a stride past 2^31 - 1 elements: {t.stride()}")


def _strides(t):
    """t's strides over its first three dimensions, 0 along those of size 1 (never stepped, so a call's plan
    does not depend on them)."""
    return tuple(0 if n == 1 else st for n, st in zip(t.shape[:3], t.stride()[:3]))


def _mask_strides(mask):
    """mask's strides over [B, Hq, S, L] (0 along the dimensions it broadcasts)."""
    if mask is None:
        return (0, 0, 0, 0)
    pad = 4 - mask.dim()
    return tuple(0 if d < pad or mask.shape[d - pad] == 1 else mask.stride(d - pad) for d in range(4))


def kernel_config(B, hq, hkv, S, L, D, wave: int, sms: int, *, additive: bool = False, rope: bool = False):
    """(rows per block, row groups, waves per block, keys in flight per lane group, keys per split, splits).
    A block holds up to 4 query rows of one key / value head (more take several row groups) and 512 threads (fewer
    where the waves' partial results would pass 32 KB of shared memory): at a short cache every wave has only a
    few keys, since the block's waves are all its SM has to hide latency with (H100, 72 keys: 4 waves of 16 keys
    each took 12.6 us in a compiled Llama step). Caches longer than two block-iterations are split across blocks,
    up to one block per SM (a 512-thread block's registers fill it). A cache short enough for no split is
    latency-bound: its rows then spread over more blocks (fewer rows each, the keys read once per block from L2)
    while the grid stays within one block per SM (H100, rotary step, 8 key / value heads of 4 query rows, 72 keys:
    4 / 2 / 1 rows per block 7.1 / 4.7 / 3.7 us; at B = 8 the grid allows 2 rows: 7.9 -> 5.6 us)."""
    rows = (hq // hkv) * S
    L1 = max(L, 1)

    def shape(k_rows):
        warps = min(512 // wave, 16, 1 << (8192 // (k_rows * D)).bit_length() - 1)
        # keys in flight that 512 threads' registers hold without spilling (sm_90a, every mask and rotary variant
        # checked; fewer rows leave registers for more keys); AMD keeps 2
        max_unroll = (4 if k_rows <= 2 else 3) if wave <= 32 else 2
        step = warps * (wave // C.next_pow2(D // 8))      # keys a block takes per key in flight per lane group
        return C.ceil_div(rows, k_rows), warps, max_unroll, step

    k_rows = min(C.next_pow2(rows), 4)
    while k_rows > 1:
        groups, _, max_unroll, step = shape(k_rows // 2)
        if B * hkv * groups > sms or L1 > 2 * max_unroll * step:
            break
        k_rows //= 2
    groups, warps, max_unroll, step = shape(k_rows)
    nsplit = 1 if L1 <= 2 * max_unroll * step else max(1, min(C.ceil_div(L1, step), sms // (B * hkv * groups)))
    per_split = C.ceil_div(L1, nsplit)
    unroll = min(max_unroll, C.ceil_div(per_split, step))
    if k_rows > 2 or wave > 32:
        if additive:
            unroll = min(unroll, 2)     # an additive mask's values take registers too
        if rope:                        # the new key and value held in registers: one key fewer in flight
            unroll = min(unroll, 2 if not additive else 1)   # (sm_90a, 16 waves: unroll 3 / additive 2 spill)
    return k_rows, groups, warps, unroll, per_split, C.ceil_div(L1, per_split)


def _run(call, q, k, v, mask, scale, causal, out, rope=None, advance=False):
    """rope: (k_new, v_new, cos, sin, position) for decode_attention_rope; k, v are then the caches. advance: the
    kernel adds one to position (rope only)."""
    tm = C.torch()
    B, hq, S, D = q.shape
    hkv, L = k.shape[1], k.shape[2]
    shape = (B, S, hq, D)
    if out is None:
        out = call.empty(shape, q.dtype, q.device)
    else:
        C.check_tensor("decode_attention", "out", out, dtypes=(q.dtype,), shape=shape, device=q.device)
    if out.numel() == 0:
        return out
    if B * hkv >= 2 ** 31:
        raise ValueError(f"decode_attention: {B} x {hkv} sequence heads are too many for one launch")
    dev = q.device.index or 0
    info = C.device_info(dev)
    kmask = 0 if mask is None else 1 if mask.dtype == tm.bool else 2
    k_rows, groups, warps, unroll, per_split, nsplit = kernel_config(B, hq, hkv, S, L, D, info["wave"], info["sms"],
                                                                     additive=kmask == 2, rope=rope is not None)
    ttype = C.kernel_type(q.dtype)
    strides = _strides(q) + _strides(k) + _strides(v)
    if rope is not None:
        kn, vn, cs, sn, pos = rope
        rope_strides = _strides(kn)[:2] + _strides(vn)[:2] + _strides(cs)[:1]
        is_aligned = C.aligned(q, k, v, kn, vn, cs, sn) and all(st % 8 == 0 for st in strides + rope_strides)
    else:
        is_aligned = C.aligned(q, k, v) and all(st % 8 == 0 for st in strides)
    mod = C.module(_SRC)
    kern = mod[f"decode_attention_kernel<{ttype}, {D}, {k_rows}, {kmask}, {C.cbool(is_aligned)}, {warps}, {unroll}, "
               f"{C.cbool(rope is not None)}, {C.cbool(advance)}>"]
    dummy = call.const(C.dummy_f32(dev))
    if nsplit > 1:
        part = call.empty((B * hq * S * nsplit * D,), tm.float32, q.device)
        part_ml = call.empty((B * hq * S * nsplit * 2,), tm.float32, q.device)
    else:
        part = part_ml = dummy
    # without rope its pointers are never read: the output stands in for the T* ones
    tensors = (q, k, v, mask if mask is not None else dummy) + \
        ((kn, vn, cs, sn, pos) if rope is not None else (out,) * 4 + (call.const(C.dummy_i64(dev)),))
    args = []
    for t in tensors:
        if not t.is_contiguous():       # a strided view goes by address: no plan can name it (nor replay it)
            call.forget()
            t = t.data_ptr()
        args.append(t)
    call.launch(kern, (B * hkv, nsplit, groups), warps * info["wave"], out, part, part_ml, *args[:4],
                hkv, hq // hkv, S, L, per_split, *strides, *_mask_strides(mask), scale, int(causal), *args[4:],
                *(rope_strides if rope is not None else (0,) * 5))
    if nsplit > 1:
        call.launch(mod[f"decode_attention_combine<{ttype}, {D}>"], B * hq * S, D, out, part, part_ml, hq, S,
                    nsplit)
    return out


def _scale(name, scale, D) -> float:
    if scale is None:
        return float(D) ** -0.5
    return scale if type(scale) is float else C.check_float(name, "scale", scale)


def _custom_op():
    """(impl, fake) of torch.ops.rocjit.decode_attention."""
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], scale: float, causal: bool) -> Tensor:
        _check("decode_attention", q, k, v, mask)
        return _run(UNRECORDED, q, k, v, mask, float(scale), bool(causal), None)

    def fake(q, k, v, mask, scale, causal):
        B, hq, S, D = q.shape
        return q.new_empty((B, S, hq, D))

    return impl, fake


@op(roles="TTTTOOT", sources=(_SRC,), bench="decode", custom_op=_custom_op, flexible_layout=True)
def decode_attention(call, q, k, v, mask=None, *, scale=None, causal=False, out=None):
    """softmax(q kᵀ · scale + mask) v for q [B, Hq, S, D] against k, v [B, Hkv, L, D]: out [B, S, Hq, D]."""
    name = "decode_attention"
    qt, fw = C.to_torch(q, "q", name)
    kt = C.to_torch(k, "k", name)[0]
    vt = C.to_torch(v, "v", name)[0]
    mt = C.torch_or_none(mask, "mask", name)
    ot = C.torch_or_none(out, "out", name)
    _check(name, qt, kt, vt, mt)
    if type(causal) is not bool:
        raise TypeError(f"{name}: causal must be a bool, got {type(causal).__name__}")
    sc = _scale(name, scale, qt.shape[3])
    if C.compiling():
        y = C.into_out(decode_attention.__rocjit_op__.torch_op()(qt, kt, vt, mt, sc, causal), ot)
    else:
        y = _run(call, qt, kt, vt, mt, sc, causal, ot)
    return call.done(C.to_caller(y, out, fw))


# ----------------------------------------------------------------------------- rotary + cache update + attention
def _check_rope(name, q, k, v, cos, sin, k_cache, v_cache, position, mask):
    _check(name, q, k_cache, v_cache, mask)
    B, Hq, S, D = q.shape
    hkv = k_cache.shape[1]
    if S != 1:
        raise ValueError(f"{name}: q must hold one new token per sequence ([B, Hq, 1, D]), got {tuple(q.shape)}")
    if D % 16:
        raise ValueError(f"{name}: the head dimension must be a multiple of 16 (rotary halves), got {D}")
    for n, t in (("k", k), ("v", v)):
        C.check_tensor(name, n, t, dtypes=(q.dtype,), shape=(B, hkv, 1, D), device=q.device, contiguous=False)
    for n, t in (("cos", cos), ("sin", sin)):
        C.check_tensor(name, n, t, dtypes=(q.dtype,), dim=3, device=q.device, contiguous=False)
        if t.shape[0] not in (1, B) or tuple(t.shape[1:]) != (1, D):
            raise ValueError(f"{name}: {n} must be [B or 1, 1, D] = [{B} or 1, 1, {D}], got {tuple(t.shape)}")
    if cos.shape != sin.shape or _strides(cos) != _strides(sin):
        raise ValueError(f"{name}: cos and sin must have one shape and layout, got {tuple(cos.shape)} / "
                         f"{cos.stride()} and {tuple(sin.shape)} / {sin.stride()}")
    C.check_tensor(name, "position", position, dtypes=(C.torch().int64,), device=q.device, contiguous=False)
    if position.numel() != 1:
        raise ValueError(f"{name}: position must hold one element (the new token's cache index), got shape "
                         f"{tuple(position.shape)}")
    for n, t in (("k", k), ("v", v), ("cos", cos), ("sin", sin)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: {n} must have a contiguous last dimension, got strides {t.stride()}")
        if any(abs(st) > _MAX_STRIDE for st in t.stride()):
            raise ValueError(f"{name}: {n} has a stride past 2^31 - 1 elements: {t.stride()}")
    if k_cache is v_cache or (not C.compiling() and k_cache.data_ptr() == v_cache.data_ptr()):
        raise ValueError(f"{name}: k_cache and v_cache must be different tensors")


def _rope_custom_op():
    """(impl, fake) of torch.ops.rocjit.decode_attention_rope (writes k_cache and v_cache)."""
    tm = C.torch()
    Tensor = tm.Tensor

    def impl(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
             position: Tensor, mask: Optional[Tensor], scale: float, advance: bool) -> Tensor:
        name = "decode_attention_rope"
        _check_rope(name, q, k, v, cos, sin, k_cache, v_cache, position, mask)
        return _run(UNRECORDED, q, k_cache, v_cache, mask, float(scale), False, None,
                    rope=(k, v, cos, sin, position.reshape(1)), advance=bool(advance))

    def fake(q, k, v, cos, sin, k_cache, v_cache, position, mask, scale, advance):
        B, hq, S, D = q.shape
        return q.new_empty((B, S, hq, D))

    return impl, fake


@op(roles="TTTTTTTTTOTO", sources=(_SRC,), bench="decode", custom_op=_rope_custom_op,
    mutates_args=("k_cache", "v_cache", "position"), flexible_layout=True)
def decode_attention_rope(call, q, k, v, cos, sin, k_cache, v_cache, position, mask=None, *, scale=None, out=None,
                          advance=False):
    """Rotary embedding of q [B, Hq, 1, D] and the new key [B, Hkv, 1, D], the key and v written into k_cache /
    v_cache [B, Hkv, L, D] at `position`, then decode_attention of q over the caches: out [B, 1, Hq, D].
    advance=True: position grows by one in the same kernel."""
    name = "decode_attention_rope"
    qt, fw = C.to_torch(q, "q", name)
    kt, vt = C.to_torch(k, "k", name)[0], C.to_torch(v, "v", name)[0]
    ct, st = C.to_torch(cos, "cos", name)[0], C.to_torch(sin, "sin", name)[0]
    kc, vc = C.to_torch(k_cache, "k_cache", name)[0], C.to_torch(v_cache, "v_cache", name)[0]
    pt = C.to_torch(position, "position", name)[0]
    mt = C.torch_or_none(mask, "mask", name)
    ot = C.torch_or_none(out, "out", name)
    if type(advance) is not bool:
        raise TypeError(f"{name}: advance must be a bool, got {type(advance).__name__}")
    _check_rope(name, qt, kt, vt, ct, st, kc, vc, pt, mt)
    sc = _scale(name, scale, qt.shape[3])
    if C.compiling():
        y = C.into_out(decode_attention_rope.__rocjit_op__.torch_op()(qt, kt, vt, ct, st, kc, vc, pt, mt, sc,
                                                                      advance), ot)
    else:
        y = _run(call, qt, kc, vc, mt, sc, False, ot, rope=(kt, vt, ct, st, pt.reshape(1)), advance=advance)
    return call.done(C.to_caller(y, out, fw))
