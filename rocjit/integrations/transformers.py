"""Run a Hugging Face transformers model's decoder on rocjit ops, in place, and undo it.

    from rocjit.integrations import transformers as rt
    rt.patch(model)                 # bf16 / fp16: fused norms, residual adds fused into the norms, rocjit MLP
    rt.patch(model, fp8=True)       # + FP8 decode GEMMs (weights quantized once, per output channel)
    ...model.generate(...)...       # DynamicCache; StaticCache + torch.compile(fullgraph=True) too
    rt.unpatch(model)

What changes, for the Llama, Mistral, Qwen2 and Qwen3 families (decoder layers with input_layernorm,
self_attn, post_attention_layernorm and a SwiGLU mlp):
- every RMSNorm of the model -> ``ops.rms_norm`` (q_norm / k_norm of Qwen3 included);
- each decoder layer adds the attention output to the residual stream inside the post-attention norm
  (one kernel reads both and writes the sum and the normalized rows), and at decode the MLP's down GEMM adds its
  result into that sum in its epilogue (``skinny_gemm_residual``);
- each MLP, for at most ``ops.skinny.MAX_M`` (32) tokens: one ``skinny_gemm`` over gate and up weights stored
  as one [2I, H] matrix (gate_proj.weight and up_proj.weight become views of it; nothing is copied twice),
  ``swiglu``, and ``skinny_gemm`` for down; more tokens (prefill) use the model's own code;
- each attention, for at most ``max_m`` tokens: q, k and v in one ``skinny_gemm`` over their weights stored as one
  [q + k + v, H] matrix (q_proj / k_proj / v_proj weights become views of it), then the model's own rotary
  embedding and cache update, ``ops.decode_attention`` over the cache where the model's attention function is
  transformers' sdpa or eager one (one kernel instead of the mask / layout kernels and SDPA; see
  _decode_attention for when the model's function runs instead: flash, other registrations, attention weights
  asked for), and o_proj; a transformers version whose attention forward differs from the one this was written
  against keeps its own attention (with a warning). One decode token per sequence with a static cache
  (transformers' ``StaticCache``, whose layer this module knows: see _static_layer) takes one kernel for all of
  rotary, cache write and attention (``ops.decode_attention_rope``) where the model's rotary embedding is the
  rotate-half one (checked numerically when patching) and there are no q / k norms;
- with ``fp8=True``: the MLP and the attention projections keep an FP8 copy of their weights (e4m3, one scale per
  output channel); at decode the post-attention norm writes FP8 activations with per-token scales that the gate/up
  GEMM reads directly, swiglu quantizes per token for down, the input norm writes FP8 rows with per-token scales
  for the fused q/k/v GEMM, and o_proj quantizes its input per token. The bf16 weights stay (prefill uses them, and
  ``unpatch`` gives the model back unchanged);
- the output projection to the vocabulary (``lm_head``, a bias-free Linear, tied to the embeddings or not), for at
  most ``max_m`` tokens: ``skinny_gemm`` over its weight as it is (bf16 / fp16 in both modes: the logits are not
  quantized).
Anything that needs gradients (``requires_grad`` inputs with grad enabled) runs the stock code. Under
torch.compile the patched forwards call the ops as ``torch.ops.rocjit.*`` custom ops directly (see _TracedOps:
fewer guards for the compiled model to evaluate on every call).
"""
from __future__ import annotations

import functools
import inspect
import sys
import warnings

_ATTR = "_rocjit_patch"
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
_LAYER_PARAMS = ["self", "hidden_states", "attention_mask", "position_ids", "past_key_values", "use_cache",
                 "position_embeddings"]
_ATTN_PARAMS = ["self", "hidden_states", "position_embeddings", "attention_mask", "past_key_values"]
# The cache parameter of the decoder layer and attention forwards (the 5th in both): transformers renamed it from
# past_key_values to cache (5.2x) and passes it by keyword. The patched forwards keep past_key_values, take either.
_CACHE_NAMES = ("past_key_values", "cache")
_ATTN_NAMES = ("apply_rotary_pos_emb", "ALL_ATTENTION_FUNCTIONS", "eager_attention_forward")
_FP8_INPUT = "_rocjit_fp8_input"       # keyword from the patched layer to its fused attention


class PatchError(ValueError):
    """The model is not one this integration knows how to patch (the message says why)."""


def _torch():
    import torch
    return torch


def _ops():
    """The ops the patched forwards call: rocjit.ops (an eager call replays a native plan), or while torch.compile
    traces, the same ops called as torch.ops.rocjit.* (_TracedOps)."""
    if _torch().compiler.is_compiling():
        return _TRACED_OPS
    from rocjit import ops
    return ops


def _custom_ops():
    """torch.ops.rocjit (registered when rocjit.ops is imported, which patch does)."""
    return _torch().ops.rocjit


def _act(x):
    """An activation as the kernels take it: float16 / bfloat16 / FP8, contiguous (no copy where it already is)."""
    torch = _torch()
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        raise TypeError(f"rocjit: the patched model computes in {x.dtype}; patch needs a float16 or bfloat16 model")
    return x.contiguous()


def _in_place(t):
    """A tensor an op updates in place: contiguous, or the update would land in a copy."""
    if not t.is_contiguous():
        raise ValueError(f"rocjit: a residual updated in place must be contiguous, got strides {t.stride()}")
    return t


class _TracedOps:
    """rocjit's ops with the public functions' keywords, as the patched forwards call them while torch.compile
    traces: torch.ops.rocjit.* directly. Traced through the public functions, their argument checks and
    framework conversions put a guard on each global, function and constant they read, and the compiled model
    evaluates every guard again on every call. On an H100 host a 4-layer FP8 Llama so compiled had 1631 guards
    and spent 114 - 125 us per decode step evaluating them, the stock model 1214 and 78 - 80 us. The integration
    passes the model's own tensors (its dtype is checked at patch time, the activations' here, as they are
    traced, which adds no guard)."""

    @staticmethod
    def rms_norm(x, weight, eps=1e-6, *, residual=None, quant=None, fp8_format=None):
        if residual is not None:
            _in_place(residual)
        y, s = _custom_ops().rms_norm(_act(x), weight, eps, residual, None, quant or "none", fp8_format or "e4m3fn")
        out = (y,) + ((s,) if quant == "per_token" else ()) + ((residual,) if residual is not None else ())
        return out if len(out) > 1 else out[0]

    @staticmethod
    def quantize_fp8(x, *, granularity, fp8_format=None):
        q, s = _custom_ops().quantize_fp8(_act(x), None, granularity, fp8_format or "e4m3fn")
        return q, s

    @staticmethod
    def skinny_gemm(a, w, *, scale_a=None, scale_w=None, out_dtype=None):
        if out_dtype is None:
            out_dtype = _torch().bfloat16 if a.element_size() == 1 else a.dtype
        return _custom_ops().skinny_gemm(_act(a), w, scale_a, scale_w, str(out_dtype).replace("torch.", ""))

    @staticmethod
    def swiglu(gate_up, *, quant=None, fp8_format=None):
        y, s = _custom_ops().swiglu(_act(gate_up), None, quant or "none", fp8_format or "e4m3fn")
        return (y, s) if quant == "per_token" else y

    @staticmethod
    def skinny_gemm_residual(a, w, residual, *, scale_a=None, scale_w=None):
        _custom_ops().skinny_gemm_residual(_act(a), w, _in_place(residual), scale_a, scale_w)
        return residual

    @staticmethod
    def decode_attention(q, k, v, mask=None, *, scale, causal=False):
        return _custom_ops().decode_attention(q, k, v, mask, float(scale), causal)

    @staticmethod
    def decode_attention_rope(q, k, v, cos, sin, k_cache, v_cache, position, mask=None, *, scale, advance=False):
        return _custom_ops().decode_attention_rope(q, k, v, cos, sin, k_cache, v_cache, position, mask,
                                                   float(scale), advance)


_TRACED_OPS = _TracedOps()


def _grad(t) -> bool:
    return t.requires_grad and _torch().is_grad_enabled()


def _on_device(t) -> bool:
    """Where the rocjit kernels run (inputs elsewhere take the model's own code)."""
    return t.is_cuda


def _rows(x):
    """x as [rows, hidden] (a view where the layout allows)."""
    return x.reshape(-1, x.shape[-1])


def _quant_rows(x2, fmt):
    """Per-token FP8 of [rows, hidden] activations: (q, scales [rows]) as the decode GEMMs take them."""
    q, s = _ops().quantize_fp8(x2, granularity="token", fp8_format=fmt)
    return q, s.view(-1)


def _stock(x, max_m: int) -> bool:
    """This call runs the model's own code: more rows than the decode kernels take, gradients, or not on a GPU."""
    return x.numel() // x.shape[-1] > max_m or _grad(x) or not _on_device(x)


# ----------------------------------------------------------------------------- weights
def quantize_weight_fp8(w, fmt: str = "e4m3fn"):
    """(q [N, K] fp8, scale [N] float32) with w ~= q * scale[:, None]: one scale per output channel."""
    from rocjit.ops import _common as C
    wf = w.detach().float()
    fmax = C.fp8_max(fmt)
    scale = (wf.abs().amax(dim=1) / fmax).clamp(min=1e-12)
    q = (wf / scale[:, None]).clamp(-fmax, fmax).to(C.fp8_torch_dtype(fmt))
    return q.contiguous(), scale.contiguous()


def _fp8_format(device) -> str:
    """The device's native e4m3 flavour (e4m3fnuz on MI300X); e4m3fn off the GPU."""
    from rocjit.ops import _common as C
    return C.fp8_format(None, device) if device.type == "cuda" else "e4m3fn"


# ----------------------------------------------------------------------------- forwards
def _norm_forward(self, hidden_states):
    if _grad(hidden_states) or not _on_device(hidden_states):
        return _stock_forward(self, hidden_states)
    # the model may normalize a view (Qwen3's q_norm / k_norm get per-head views of the projections' output)
    return _ops().rms_norm(hidden_states.contiguous(), self.weight, self._rocjit_eps)


def _mlp_forward(self, x):
    p = getattr(self, _ATTR)
    if _stock(x, p["max_m"]):
        return _stock_forward(self, x)
    ops = _ops()
    x2 = _rows(x)
    if p["fp8"]:
        h, hs = _gate_up_fp8(p, *_quant_rows(x2, p["fmt"]))
        y = ops.skinny_gemm(h, p["down_fp8"], scale_a=hs, scale_w=p["down_scale"], out_dtype=p["dtype"])
    else:
        gu = ops.skinny_gemm(x2, p["gate_up"])
        y = ops.skinny_gemm(ops.swiglu(gu), self.down_proj.weight)
    return y.view(*x.shape[:-1], y.shape[-1])


def _gate_up_fp8(p, q, s):
    """gate/up GEMM on FP8 activations with per-row scales -> swiglu + per-token FP8: (h, its scales [rows])."""
    ops = _ops()
    gu = ops.skinny_gemm(q, p["gate_up_fp8"], scale_a=s.view(-1), scale_w=p["gate_up_scale"], out_dtype=p["dtype"])
    h, hs = ops.swiglu(gu, quant="per_token", fp8_format=p["fmt"])
    return h, hs.view(-1)


def _linear_fp8_forward(self, x):
    p = getattr(self, _ATTR)
    if _stock(x, p["max_m"]):
        return _stock_forward(self, x)
    q, s = _quant_rows(_rows(x), p["fmt"])
    y = _ops().skinny_gemm(q, p["w"], scale_a=s, scale_w=p["scale"], out_dtype=x.dtype)
    if self.bias is not None:
        y = y + self.bias
    return y.view(*x.shape[:-1], y.shape[-1])


def _linear_forward(self, x):
    """A bias-free Linear in the model's dtype (the output projection to the vocabulary) on skinny_gemm."""
    if _stock(x, getattr(self, _ATTR)["max_m"]):
        return _stock_forward(self, x)
    y = _ops().skinny_gemm(_rows(x), self.weight)
    return y.view(*x.shape[:-1], y.shape[-1])


def _attn_forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                  **kwargs):
    """The model's attention with q, k and v from one GEMM (the rest as the model's own forward does it)."""
    p = getattr(self, _ATTR)
    pre = kwargs.pop(_FP8_INPUT, None)     # (FP8 rows, per-row scales) of hidden_states from the layer's norm
    past_key_values = _cache_arg(past_key_values, kwargs)
    if _stock(hidden_states, p["max_m"]):
        return _stock_forward(self, hidden_states, position_embeddings, attention_mask, past_key_values, **kwargs)
    ops = _ops()
    mod = self._rocjit_fns         # the model module's helpers (a class attribute of the patched subclass)
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    x2 = _rows(hidden_states)
    if p["fp8"]:
        q8, s = pre if pre is not None else _quant_rows(x2, p["fmt"])
        qkv = ops.skinny_gemm(q8, p["qkv_fp8"], scale_a=s, scale_w=p["qkv_scale"],
                              out_dtype=hidden_states.dtype)
    else:
        qkv = ops.skinny_gemm(x2, p["qkv"])
    if p["bias"] is not None:
        qkv = qkv + p["bias"]
    q, k, v = qkv.view(*input_shape, -1).split(p["sizes"], dim=-1)
    q, k, v = q.view(hidden_shape), k.view(hidden_shape), v.view(hidden_shape)
    if p["qk_norm"]:
        q, k = self.q_norm(q), self.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    cos, sin = position_embeddings
    interface = mod.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                          mod.eager_attention_forward)
    if p["rope_step"] and q.shape[2] == 1:
        out = _rope_step(self, ops, interface, past_key_values, q, k, v, cos, sin, attention_mask, kwargs)
        if out is not None:
            return self.o_proj(out.view(*input_shape, -1)), None
    q, k = mod.apply_rotary_pos_emb(q, k, cos, sin)
    if past_key_values is not None:
        k, v = past_key_values.update(k, v, self.layer_idx, kwargs=kwargs) if p["update_kwargs"] else \
            past_key_values.update(k, v, self.layer_idx)
    out = _decode_attention(self, ops, interface, q, k, v, attention_mask, kwargs) if p["attention"] else None
    if out is not None:
        return self.o_proj(out.view(*input_shape, -1)), None
    if p["sliding"]:
        kwargs["sliding_window"] = getattr(self, "sliding_window", getattr(self.config, "sliding_window", None))
    out, weights = interface(self, q, k, v, attention_mask, dropout=0.0 if not self.training else
                             self.attention_dropout, scaling=self.scaling, **kwargs)
    out = out.reshape(*input_shape, -1).contiguous()
    return self.o_proj(out), weights


def _attention_args(self, interface, q, k, v, mask, kwargs):
    """(mask, causal) with which ``ops.decode_attention`` computes what the model's attention function would:
    transformers' own sdpa or eager function (any other, e.g. flash or a user's registration, keeps running), no
    dropout, no attention weights asked for, a mask that is None, boolean or additive in q's dtype. None: run the
    model's. Sliding windows need nothing here: these two functions take the window from the mask, as this does."""
    fns = self._rocjit_fns
    if interface is not fns.sdpa_attention_forward and interface is not fns.eager_attention_forward:
        return None
    if self.training or kwargs.get("output_attentions"):
        return None
    torch = _torch()
    S, L, D = q.shape[2], k.shape[2], q.shape[3]
    causal = False
    if mask is None:
        if S > 1 and interface is fns.sdpa_attention_forward and getattr(self, "is_causal", True):
            if S != L:          # sdpa's is_causal aligns the queries top-left; only S == L means the same here
                return None
            causal = True
    elif mask.dim() != 4 or mask.dtype not in (torch.bool, q.dtype) or mask.shape[-1] < L:
        return None
    elif mask.shape[-1] != L:
        mask = mask[:, :, :, :L]
    if (q.dtype not in (torch.float16, torch.bfloat16) or D % 8 or D > 256 or q.shape[1] % k.shape[1]
            or k.shape[3] != D or v.shape != k.shape or q.stride(3) != 1 or k.stride(3) != 1 or v.stride(3) != 1):
        return None
    return mask, causal


def _decode_attention(self, ops, interface, q, k, v, mask, kwargs):
    """``ops.decode_attention`` where it computes what the model's attention function would (_attention_args);
    None: run the model's."""
    args = _attention_args(self, interface, q, k, v, mask, kwargs)
    if args is None:
        return None
    return ops.decode_attention(q, k, v, args[0], scale=self.scaling, causal=args[1])


_STATIC_LAYER: list = []      # [transformers' StaticLayer class, or None where its update is not the one known here]


def _static_layer_class():
    """transformers' StaticLayer where its update is the one _rope_step reproduces: the new states written with
    index_copy_ at cumulative_length, which then grows by their count. None otherwise (another version)."""
    if not _STATIC_LAYER:
        cls = None
        try:
            from transformers.cache_utils import StaticLayer
            src = inspect.getsource(StaticLayer.update)
            known = ("cache_position = torch.arange(kv_length, device=self.device) + self.cumulative_length",
                     "self.cumulative_length.add_(kv_length)", "self.keys.index_copy_(2, cache_position, key_states)",
                     "self.values.index_copy_(2, cache_position, value_states)")
            if all(k in src for k in known):
                cls = StaticLayer
        except (ImportError, AttributeError, OSError, TypeError):
            pass
        _STATIC_LAYER.append(cls)
    return _STATIC_LAYER[0]


def _static_layer(cache, idx: int):
    """The cache's layer `idx` where it is an initialized StaticLayer of the known kind (not a subclass: sliding
    windows and indexed layers write elsewhere) and the cache does no offloading; else None."""
    cls = _static_layer_class()
    layers = getattr(cache, "layers", None)
    if cls is None or layers is None or getattr(cache, "offloading", False) or idx >= len(layers):
        return None
    layer = layers[idx]
    if type(layer) is not cls or not getattr(layer, "is_initialized", False):
        return None
    return layer


def _rope_step(self, ops, interface, cache, q, k, v, cos, sin, mask, kwargs):
    """One decode token against a static cache in one kernel: rotary of q and k, k and v into the cache at its
    cumulative length, attention (ops.decode_attention_rope), and the length grows by one as the layer's own
    update would. None: the model's path (another cache, a mask or layout the kernel does not take)."""
    layer = _static_layer(cache, self.layer_idx)
    if layer is None:
        return None
    keys, values = layer.keys, layer.values
    torch = _torch()
    B, D = q.shape[0], q.shape[3]
    # (head_dim, the caches' shapes and strides: _attention_args below)
    if (tuple(keys.shape[:2]) != (B, k.shape[1]) or keys.dtype != q.dtype or values.dtype != q.dtype or D % 16 or cos.dtype != q.dtype
            or sin.dtype != q.dtype or cos.dim() != 3 or cos.shape[0] not in (1, B) or tuple(cos.shape[1:]) != (1, D)
            or sin.shape != cos.shape or cos.stride(2) != 1 or sin.stride(2) != 1 or k.stride(3) != 1
            or v.stride(3) != 1 or layer.cumulative_length.dtype != torch.int64
            or layer.cumulative_length.device != q.device):
        return None
    args = _attention_args(self, interface, q, keys, values, mask, kwargs)
    if args is None or args[1]:
        return None
    # the kernel also grows the length by one (advance): no kernel of its own for that, each a step's graph node
    return ops.decode_attention_rope(q, k, v, cos, sin, keys, values, layer.cumulative_length, args[0],
                                     scale=self.scaling, advance=True)


@functools.lru_cache(maxsize=None)
def _rotate_half_rope(fn) -> bool:
    """Whether the model's apply_rotary_pos_emb(q, k, cos, sin) is q cos + rotate_half(q) sin (and the same for
    k), rotate_half(x) = [-x[D/2:], x[:D/2]], cos / sin [B, S, D] broadcast over heads: tried on random float64
    tensors on the CPU, once per function (every layer of a model shares its module's)."""
    torch = _torch()
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 1, 16, generator=g, dtype=torch.float64), torch.randn(2, 1, 1, 16, generator=g,
                                                                                   dtype=torch.float64)
    cos, sin = torch.randn(2, 1, 16, generator=g, dtype=torch.float64), torch.randn(2, 1, 16, generator=g,
                                                                                    dtype=torch.float64)

    def ref(x):
        return x * cos[:, None] + torch.cat([-x[..., 8:], x[..., :8]], -1) * sin[:, None]
    try:
        qr, kr = fn(q, k, cos, sin)
        return bool(torch.allclose(qr, ref(q)) and torch.allclose(kr, ref(k)))
    except Exception:       # any other signature or convention: the model's own path
        return False


class _AttentionFunctions:
    """The model module's rotary, attention-function registry and eager attention, as the fused forward calls
    them (a class attribute of the patched attention class)."""

    def __init__(self, module):
        for n in _ATTN_NAMES:
            setattr(self, n, getattr(module, n))
        try:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward
        except ImportError:
            sdpa_attention_forward = None
        self.sdpa_attention_forward = sdpa_attention_forward


def _cache_arg(past_key_values, kwargs):
    """The cache a forward was given, under either of its names (see _CACHE_NAMES)."""
    return kwargs.pop("cache", None) if past_key_values is None else past_key_values


def _known_params(params, known) -> bool:
    """`params` begin as `known` does, the cache parameter under either of its names."""
    head = params[:len(known)]
    return len(head) == len(known) and all(p == k or (k == "past_key_values" and p in _CACHE_NAMES)
                                           for p, k in zip(head, known))


def _cache_param(cls) -> str:
    """The name under which `cls.forward` takes the cache."""
    return list(inspect.signature(cls.forward).parameters)[_ATTN_PARAMS.index("past_key_values")]


def _fusable_attention(attn) -> str | None:
    """Why this attention cannot take the fused q/k/v forward (None: it can)."""
    torch = _torch()
    mod = sys.modules.get(type(attn).__module__)
    if mod is None or not all(hasattr(mod, n) for n in _ATTN_NAMES):
        return f"{type(attn).__module__} lacks {', '.join(_ATTN_NAMES)}"
    params = list(inspect.signature(type(attn).forward).parameters)
    if not _known_params(params, _ATTN_PARAMS):
        return f"{type(attn).__name__}.forward takes {params}"
    lins = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
    if not all(isinstance(m, torch.nn.Linear) for m in lins):
        return "q_proj / k_proj / v_proj / o_proj are not all nn.Linear"
    if not all(hasattr(attn, a) for a in ("head_dim", "layer_idx", "scaling", "config")):
        return f"{type(attn).__name__} lacks head_dim / layer_idx / scaling / config"
    if len({m.bias is None for m in lins[:3]}) != 1:
        return "q/k/v projections mix biased and unbiased"
    try:
        src = inspect.getsource(type(attn).forward)
    except (OSError, TypeError):
        return f"the source of {type(attn).__name__}.forward is not available"
    # the forward this integration reproduces: projections, optional q/k norms, rotary, cache, attention, o_proj
    expected = ("self.q_proj(hidden_states)", "self.k_proj(hidden_states)", "self.v_proj(hidden_states)",
                "apply_rotary_pos_emb(query_states, key_states, cos, sin)",
                f"{params[4]}.update(key_states, value_states, self.layer_idx", "self.o_proj(attn_output)")
    missing = [e for e in expected if e not in src]
    if missing:
        return f"{type(attn).__name__}.forward does not contain {missing}"
    extra = {"q_norm", "k_norm"} & set(dict(attn.named_children()))
    if extra and not ("self.q_norm(" in src and "self.k_norm(" in src):
        return f"{type(attn).__name__} has q/k norms used in a way not known here"
    return None


def _patch_attention(attn, fp8: bool, fmt, max_m: int, attention: bool):
    """Fused q/k/v for one attention: its projections' weights become views of one matrix."""
    torch = _torch()
    lins = [attn.q_proj, attn.k_proj, attn.v_proj]
    sizes = [m.weight.shape[0] for m in lins]
    qkv = torch.cat([m.weight for m in lins]).contiguous()
    off = 0
    for m, n in zip(lins, sizes):
        m.weight = torch.nn.Parameter(qkv[off:off + n], requires_grad=m.weight.requires_grad)
        off += n
    bias = torch.cat([m.bias for m in lins]).contiguous() if lins[0].bias is not None else None
    src = inspect.getsource(type(attn).forward)
    p = {"qkv": qkv, "bias": bias, "sizes": sizes, "fp8": fp8, "fmt": fmt, "max_m": max_m, "attention": attention,
         "sliding": "sliding_window=" in src, "qk_norm": "self.q_norm(" in src,
         # newer transformers hand the attention's keyword arguments to the cache update too
         "update_kwargs": "self.layer_idx, kwargs=kwargs)" in src}
    # rotary, cache write and attention in one kernel for a decode token over a static cache (_rope_step)
    p["rope_step"] = attention and not p["qk_norm"] and \
        _rotate_half_rope(getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb"))
    if fp8:
        p["qkv_fp8"], p["qkv_scale"] = quantize_weight_fp8(qkv, fmt)
    setattr(attn, _ATTR, p)
    _swap_forward(attn, _attn_forward, _rocjit_fns=_AttentionFunctions(sys.modules[type(attn).__module__]))


def _layer_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                   use_cache=False, position_embeddings=None, **kwargs):
    p = getattr(self, _ATTR)
    past_key_values = _cache_arg(past_key_values, kwargs)
    if _grad(hidden_states) or not _on_device(hidden_states):
        return _stock_forward(self, hidden_states, attention_mask, position_ids, past_key_values, use_cache,
                              position_embeddings, **kwargs)
    ops = _ops()
    ln1, ln2 = self.input_layernorm, self.post_attention_layernorm
    x2 = _rows(hidden_states)
    rows = x2.shape[0]
    ap = getattr(self.self_attn, _ATTR, None)
    if ap is not None and ap["fp8"] and rows <= ap["max_m"]:
        # FP8 decode with the fused q/k/v GEMM: the input norm writes FP8 rows and their scales, which the GEMM
        # reads directly (no bf16 normalized tensor, no separate quantization)
        q8, s = ops.rms_norm(x2, ln1.weight, ln1._rocjit_eps, quant="per_token",
                             fp8_format=ap["fmt"])
        kwargs[_FP8_INPUT] = (q8, s.view(-1))
        h = hidden_states
    else:
        h = ops.rms_norm(hidden_states, ln1.weight, ln1._rocjit_eps)
    kwargs[p["attn_cache"]] = past_key_values
    attn, _ = self.self_attn(hidden_states=h, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    # attn is this layer's own fresh tensor: it receives the residual sum in place, the input stays untouched
    mlp = self.mlp
    mp = getattr(mlp, _ATTR)
    if rows > mp["max_m"]:
        normed, hsum = ops.rms_norm(hidden_states, ln2.weight, ln2._rocjit_eps, residual=attn)
        return hsum.add_(mlp(normed))
    # decode: the down GEMM adds its result into the residual stream in its epilogue (no separate add)
    if mp["fp8"]:
        q, s, hsum = ops.rms_norm(x2, ln2.weight, ln2._rocjit_eps,
                                  residual=_rows(attn), quant="per_token", fp8_format=mp["fmt"])
        h, hs = _gate_up_fp8(mp, q, s)
        ops.skinny_gemm_residual(h, mp["down_fp8"], hsum, scale_a=hs, scale_w=mp["down_scale"])
        return hsum.view(hidden_states.shape)
    normed, hsum = ops.rms_norm(x2, ln2.weight, ln2._rocjit_eps,
                                residual=_rows(attn))
    h = ops.swiglu(ops.skinny_gemm(normed, mp["gate_up"]))
    ops.skinny_gemm_residual(h, mlp.down_proj.weight, hsum)
    return hsum.view(hidden_states.shape)


# ----------------------------------------------------------------------------- patch / unpatch
def _is_rmsnorm(m) -> bool:
    name = type(m).__name__
    return name.endswith("RMSNorm") and getattr(m, "weight", None) is not None and \
        hasattr(m, "variance_epsilon") and not name.startswith("Gemma")


def _decoder_layers(model):
    layers = [m for m in model.modules() if all(hasattr(m, a) for a in
                                                 ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp"))]
    return layers


def _check_model(model, layers):
    mtype = getattr(getattr(model, "config", None), "model_type", None)
    if mtype not in FAMILIES:
        raise PatchError(f"rocjit.integrations.transformers patches the {', '.join(FAMILIES)} families; "
                         f"this model's config.model_type is {mtype!r}")
    if not layers:
        raise PatchError("no decoder layers (input_layernorm / self_attn / post_attention_layernorm / mlp) found")
    for layer in layers:
        params = list(inspect.signature(type(layer).forward).parameters)
        if not _known_params(params, _LAYER_PARAMS):
            raise PatchError(f"{type(layer).__name__}.forward takes {params}; this integration knows the "
                             f"transformers 5 decoder layer ({', '.join(_LAYER_PARAMS[1:])}, **kwargs)")
        mlp = layer.mlp
        act = getattr(getattr(mlp, "config", None), "hidden_act", "silu")
        if not all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj")) or act != "silu":
            raise PatchError(f"{type(mlp).__name__} is not a SwiGLU MLP (gate_proj / up_proj / down_proj, silu)")
        if any(getattr(mlp, a).bias is not None for a in ("gate_proj", "up_proj", "down_proj")):
            raise PatchError(f"{type(mlp).__name__} has biases; the rocjit MLP has none")


_SUBCLASSES: dict = {}        # (module class, forward) -> its patched subclass


def _swap_forward(m, forward, **class_attrs):
    """Give module `m` `forward` by moving it to a subclass of its class that defines it (one subclass per class
    and forward, reachable by name from this module so a patched model still pickles). An instance attribute
    `forward` would do the same, but torch.compile then guards every call on `m is m.forward.__self__`, a
    Python-evaluated guard per patched module (tens of microseconds per compiled decode step). `class_attrs` are
    set on the subclass when it is made (they must depend only on the class)."""
    cls = type(m)
    sub = _SUBCLASSES.get((cls, forward))
    if sub is None:
        qualname = f"_rocjit_patched_{len(_SUBCLASSES)}_{cls.__name__}"
        sub = type(cls.__name__, (cls,), {"forward": forward, "_rocjit_base": cls, "__module__": __name__,
                                          "__qualname__": qualname, **class_attrs})
        globals()[qualname] = sub
        _SUBCLASSES[(cls, forward)] = sub
    m.__class__ = sub


def _stock_forward(m, *args, **kwargs):
    """Calls the model's own forward of a patched module (its class's). A plain call of the class's function,
    which torch.compile traces (it cannot trace a bound method made with function.__get__)."""
    return type(m)._rocjit_base.forward(m, *args, **kwargs)


def _unswap_forward(m) -> None:
    base = type(m).__dict__.get("_rocjit_base")
    if base is not None:
        m.__class__ = base


def is_patched(model) -> bool:
    return getattr(model, _ATTR, None) is not None


def patch(model, *, fp8: bool = False, max_m: int | None = None, attention: bool = True):
    """Patch `model` in place (see the module docstring) and return it. The model must be in float16 or bfloat16
    (move it to the GPU first: the FP8 copies are made where the weights are; calls whose inputs are not on a GPU
    run the stock code). Patching twice is an error; ``unpatch`` first. ``attention=False`` keeps the model's
    attention function (sdpa / eager) where ``ops.decode_attention`` would replace it."""
    torch = _torch()
    from rocjit.ops import skinny
    if is_patched(model):
        raise PatchError("the model is already patched by rocjit; call unpatch(model) first")
    layers = _decoder_layers(model)
    _check_model(model, layers)
    p0 = next(model.parameters())
    if p0.dtype not in (torch.float16, torch.bfloat16):
        raise PatchError(f"patch needs a float16 or bfloat16 model, got {p0.dtype}")
    max_m = skinny.MAX_M if max_m is None else int(max_m)
    if not 1 <= max_m <= skinny.MAX_M:
        raise PatchError(f"max_m must be 1..{skinny.MAX_M}, got {max_m}")
    fmt = _fp8_format(p0.device) if fp8 else None
    _static_layer_class()       # read transformers' StaticLayer source now, never while torch.compile traces
    patched = []
    warned = False
    with torch.no_grad():
        for m in model.modules():
            if _is_rmsnorm(m):
                m._rocjit_eps = float(m.variance_epsilon)
                _swap_forward(m, _norm_forward)
                patched.append(m)
        for layer in layers:
            mlp = layer.mlp
            gate, up = mlp.gate_proj, mlp.up_proj
            n = gate.weight.shape[0]
            gate_up = torch.cat([gate.weight, up.weight]).contiguous()
            gate.weight = torch.nn.Parameter(gate_up[:n], requires_grad=gate.weight.requires_grad)
            up.weight = torch.nn.Parameter(gate_up[n:], requires_grad=up.weight.requires_grad)
            mp = {"gate_up": gate_up, "fp8": fp8, "fmt": fmt, "max_m": max_m,
                  "dtype": p0.dtype}
            attn = layer.self_attn
            why = _fusable_attention(attn)
            if why is None:
                _patch_attention(attn, fp8, fmt, max_m, attention)
                patched.append(attn)
            elif not warned:
                warnings.warn(f"rocjit: the attention keeps its own forward (q, k, v not fused): {why}", stacklevel=2)
                warned = True
            if fp8:
                mp["gate_up_fp8"], mp["gate_up_scale"] = quantize_weight_fp8(gate_up, fmt)
                mp["down_fp8"], mp["down_scale"] = quantize_weight_fp8(mlp.down_proj.weight, fmt)
                for name in ("o_proj",) if why is None else ("q_proj", "k_proj", "v_proj", "o_proj"):
                    lin = getattr(attn, name, None)
                    if isinstance(lin, torch.nn.Linear):
                        w, s = quantize_weight_fp8(lin.weight, fmt)
                        setattr(lin, _ATTR, {"w": w, "scale": s, "fmt": fmt, "max_m": max_m})
                        _swap_forward(lin, _linear_fp8_forward)
                        patched.append(lin)
            setattr(mlp, _ATTR, mp)
            _swap_forward(mlp, _mlp_forward)
            # the patched attention takes past_key_values; one that keeps its own forward, its own name
            setattr(layer, _ATTR, {"attn_cache": "past_key_values" if why is None else _cache_param(type(attn))})
            _swap_forward(layer, _layer_forward)
            patched += [mlp, layer]
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        # a plain Linear only: subclasses (quantized, vocabulary-parallel...) compute something else
        if type(head) is torch.nn.Linear and head.bias is None and head.weight.dtype == p0.dtype and \
                head.weight.is_contiguous():
            setattr(head, _ATTR, {"max_m": max_m})
            _swap_forward(head, _linear_forward)
            patched.append(head)
    setattr(model, _ATTR, {"modules": patched, "fp8": fp8})
    return model


def unpatch(model):
    """Give the model its own forwards back (and drop the FP8 weight copies). gate_proj / up_proj keep their
    weights as views of one matrix: the same values, the same results."""
    state = getattr(model, _ATTR, None)
    if state is None:
        raise PatchError("the model is not patched by rocjit")
    for m in state["modules"]:
        _unswap_forward(m)
        for a in (_ATTR, "_rocjit_eps"):
            m.__dict__.pop(a, None)
    delattr(model, _ATTR)
    return model
