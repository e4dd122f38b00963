"""rocjit.integrations.transformers without a GPU: what patch changes and unpatch restores, which models it
refuses, and the FP8 weight quantization (a patched model on the CPU runs the stock code: inputs not on a GPU)."""
import re

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rocjit.integrations import transformers as rt  # noqa: E402


def _tiny(cls_cfg=transformers.LlamaConfig, cls_model=transformers.LlamaForCausalLM, **over):
    cfg = cls_cfg(**{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "vocab_size": 100, **over})
    torch.manual_seed(0)
    return cls_model(cfg).to(torch.bfloat16).eval()


def _swapped(m) -> bool:
    return "_rocjit_base" in type(m).__dict__


def _overridden(model):
    return sorted(type(m).__name__ for m in model.modules() if _swapped(m) or "forward" in m.__dict__)


@pytest.mark.parametrize("fp8", [False, True])
def test_patch_replaces_norms_layers_mlps_and_unpatch_restores(fp8):
    model = _tiny()
    ids = torch.randint(0, 100, (1, 6))
    with torch.no_grad():
        ref = model(ids).logits
    gate = model.model.layers[0].mlp.gate_proj.weight.detach().clone()
    rt.patch(model, fp8=fp8)
    names = _overridden(model)
    assert names.count("LlamaRMSNorm") == 5              # 2 per layer + the final norm
    assert names.count("LlamaDecoderLayer") == 2 and names.count("LlamaMLP") == 2
    assert names.count("LlamaAttention") == 2            # q, k, v from one GEMM
    assert names.count("Linear") == (3 if fp8 else 1)    # lm_head; o_proj per layer (FP8)
    assert _swapped(model.lm_head) and model.lm_head._rocjit_patch == {"max_m": 32}
    attn = model.model.layers[0].self_attn
    qkv = attn._rocjit_patch["qkv"]
    assert attn.q_proj.weight.data_ptr() == qkv.data_ptr()
    assert attn.k_proj.weight.data_ptr() == qkv[64:].data_ptr() and attn.v_proj.weight.data_ptr() == qkv[96:].data_ptr()
    assert attn._rocjit_patch["sizes"] == [64, 32, 32] and not attn._rocjit_patch["sliding"]
    mlp = model.model.layers[0].mlp
    gu = mlp._rocjit_patch["gate_up"]
    # gate and up weights are views of one [2I, H] matrix, with their values unchanged
    assert mlp.gate_proj.weight.data_ptr() == gu.data_ptr() and torch.equal(mlp.gate_proj.weight, gate)
    assert mlp.up_proj.weight.data_ptr() == gu[128:].data_ptr()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)        # on the CPU every patched forward runs the stock code
    with pytest.raises(rt.PatchError, match="already patched"):
        rt.patch(model)
    rt.unpatch(model)
    assert _overridden(model) == [] and not rt.is_patched(model)
    assert not any(k.startswith("_rocjit") for m in model.modules() for k in m.__dict__)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)
    with pytest.raises(rt.PatchError, match="not patched"):
        rt.unpatch(model)


@pytest.mark.parametrize("family", ["mistral", "qwen2", "qwen3"])
def test_other_families_patch(family):
    cfg = getattr(transformers, {"mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}[family])
    cls = getattr(transformers, {"mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                 "qwen3": "Qwen3ForCausalLM"}[family])
    model = _tiny(cfg, cls)
    rt.patch(model, fp8=True)
    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    assert layers and all(_swapped(m) for m in layers)
    if family == "qwen3":                                  # q_norm / k_norm are RMSNorms too
        assert _swapped(model.model.layers[0].self_attn.q_norm)
    p = model.model.layers[0].self_attn._rocjit_patch      # the fused q/k/v forward knows the family's details
    assert p["qk_norm"] == (family == "qwen3") and p["sliding"]
    assert (p["bias"] is not None) == (family == "qwen2")  # Qwen2's q/k/v projections have biases
    rt.unpatch(model)


def test_unknown_families_and_dtypes_are_refused():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(rt.PatchError, match="model_type is 'gpt2'"):
        rt.patch(gpt2)
    with pytest.raises(rt.PatchError, match="float16 or bfloat16"):
        rt.patch(_tiny().float())
    with pytest.raises(rt.PatchError, match="max_m"):
        rt.patch(_tiny(), max_m=64)
    with pytest.raises(rt.PatchError, match="has biases"):
        rt.patch(_tiny(mlp_bias=True))


def test_fp8_weights_quantize_per_output_channel():
    torch.manual_seed(1)
    w = torch.randn(48, 96) * torch.logspace(-2, 2, 48)[:, None]      # rows of very different size
    q, s = rt.quantize_weight_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (48,) and s.dtype == torch.float32
    assert torch.allclose(q.float().abs().amax(1), torch.full((48,), 448.0))   # each row uses the full range
    err = (q.double() * s.double()[:, None] - w.double()).abs() / w.double().abs().amax(1, keepdim=True)
    assert float(err.max()) <= 2 ** -4 + 1e-6             # e4m3: half an ulp of 3 mantissa bits, per row's max


def test_an_attention_of_unknown_shape_keeps_its_forward():
    """A transformers attention whose forward is not the one the fused q/k/v path reproduces is left alone, with a
    warning naming why; the rest of the model is patched."""
    model = _tiny()
    attn_cls = type(model.model.layers[0].self_attn)

    class OtherAttention(attn_cls):
        def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                    **kwargs):
            return super().forward(hidden_states, position_embeddings, attention_mask, past_key_values, **kwargs)
    OtherAttention.__module__ = attn_cls.__module__      # the module has the helpers; the forward is another
    for layer in model.model.layers:
        layer.self_attn.__class__ = OtherAttention
    with pytest.warns(UserWarning, match="q, k, v not fused.*does not contain"):
        rt.patch(model, fp8=True)
    names = _overridden(model)
    assert "OtherAttention" not in names and names.count("Linear") == 9    # q, k, v, o each FP8 on its own; lm_head
    rt.unpatch(model)


@pytest.mark.parametrize("fp8", [False, True])
def test_a_patched_model_deep_copies(fp8):
    """copy.deepcopy of a patched model (tests and training loops copy models) works, and the copy computes what the
    original does."""
    import copy
    model = rt.patch(_tiny(), fp8=fp8)
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 100, (1, 5))
    with torch.no_grad():
        assert torch.equal(twin(ids).logits, model(ids).logits)
    assert type(twin.model.layers[0].self_attn) is type(model.model.layers[0].self_attn)
    rt.unpatch(twin)
    assert _overridden(twin) == [] and rt.is_patched(model)


@pytest.mark.parametrize("fp8", [False, True])
def test_a_patched_model_pickles_and_has_no_per_instance_forwards(fp8):
    """The patched forwards live on subclasses (reachable by name, so torch.save of a whole patched model works),
    never as instance attributes: torch.compile would guard each call on every such module with a Python check."""
    import io
    model = rt.patch(_tiny(), fp8=fp8)
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert type(model.model.layers[0].mlp).__name__ == "LlamaMLP"        # the class name a user sees is kept
    assert isinstance(model.model.layers[0].mlp, transformers.models.llama.modeling_llama.LlamaMLP)
    buf = io.BytesIO()
    torch.save(model, buf)                  # (plain pickle cannot carry FP8 tensors in this torch; torch.save can)
    buf.seek(0)
    again = torch.load(buf, weights_only=False)
    ids = torch.randint(0, 100, (1, 5))
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
    assert rt.is_patched(again)
    rt.unpatch(again)
    assert _overridden(again) == []


class _ReferenceOps:
    """The rocjit ops the integration calls, written in torch (float32 math): the patched forwards' wiring
    (fusions, residual handling, FP8 scales, views) runs on the CPU against the stock model."""

    @staticmethod
    def _fp8(x, fmt):
        fmax = 448.0
        s = (x.abs().amax(-1, keepdim=True) / fmax).clamp(min=1e-12)
        return (x / s).clamp(-fmax, fmax).to(torch.float8_e4m3fn), s

    def rms_norm(self, x, weight, eps=1e-6, *, residual=None, quant=None, fp8_format=None):
        assert x.is_contiguous()
        h = x.float() + (residual.float() if residual is not None else 0)
        if residual is not None:
            residual.copy_(h.to(residual.dtype))
            h = residual.float()
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        out = self._fp8(y, fp8_format) if quant == "per_token" else (y.to(x.dtype),)
        out = out + ((residual,) if residual is not None else ())
        return out if len(out) > 1 else out[0]

    def quantize_fp8(self, x, *, granularity, fp8_format=None):
        assert granularity == "token"
        return self._fp8(x.float(), fp8_format)

    def skinny_gemm(self, a, w, *, scale_a=None, scale_w=None, out_dtype=None):
        assert a.dim() == 2 and a.shape[0] <= 32
        y = a.float() @ w.float().t()
        if scale_a is not None:
            y = y * scale_a.view(-1, 1) * scale_w.view(1, -1)
        return y.to(out_dtype or a.dtype)

    def swiglu(self, gu, *, quant=None, fp8_format=None):
        g, u = gu.float().chunk(2, dim=-1)
        h = torch.nn.functional.silu(g) * u
        return self._fp8(h, fp8_format) if quant == "per_token" else h.to(gu.dtype)

    def skinny_gemm_residual(self, a, w, residual, *, scale_a=None, scale_w=None):
        residual.copy_((residual.float() + self.skinny_gemm(a, w, scale_a=scale_a, scale_w=scale_w,
                                                             out_dtype=torch.float32)).to(residual.dtype))
        return residual


    def decode_attention(self, q, k, v, mask=None, *, scale, causal=False):
        assert q.dim() == 4 and k.shape == v.shape and q.shape[1] % k.shape[1] == 0 and isinstance(scale, float)
        g = q.shape[1] // k.shape[1]
        S, L = q.shape[2], k.shape[2]
        s = q.float() @ k.float().repeat_interleave(g, 1).transpose(-1, -2) * scale
        if mask is not None:
            assert mask.shape[-1] == L
            s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.float()
        if causal:
            s = s.masked_fill(torch.arange(L)[None, :] > (L - S + torch.arange(S))[:, None], float("-inf"))
        p = torch.softmax(s, -1)
        return (p @ v.float().repeat_interleave(g, 1)).transpose(1, 2).contiguous().to(q.dtype)

    def decode_attention_rope(self, q, k, v, cos, sin, k_cache, v_cache, position, mask=None, *, scale,
                              advance=False):
        assert q.shape[2] == 1 and position.dtype == torch.int64 and position.numel() == 1
        h = q.shape[-1] // 2

        def rot(x):
            x = x.float()
            return x * cos.float()[:, None] + torch.cat([-x[..., h:], x[..., :h]], -1) * sin.float()[:, None]
        k_cache.index_copy_(2, position.reshape(1), rot(k).to(k_cache.dtype))
        v_cache.index_copy_(2, position.reshape(1), v)
        out = self.decode_attention(rot(q).to(q.dtype), k_cache, v_cache, mask, scale=scale)
        if advance:
            position.add_(1)
        return out


class _Recorder:
    """The torch reference ops as rocjit.ops' public functions, recording each op name called."""

    def __init__(self, calls):
        self.ref, self.calls = _ReferenceOps(), calls

    def __getattr__(self, name):
        fn = getattr(self.ref, name)
        return lambda *a, **k: (self.calls.append(name), fn(*a, **k))[1]


class _ReferenceCustomOps:
    """torch.ops.rocjit.*'s signatures (the custom ops the patched forwards call while torch.compile traces) over
    the torch references, recording the op names."""

    def __init__(self, calls):
        self.ref, self.calls = _ReferenceOps(), calls

    def _none(self, x):
        return x.new_empty((0,), dtype=torch.float32)

    def rms_norm(self, x, weight, eps, residual, scale, quant, fmt):
        assert scale is None and isinstance(eps, float) and fmt == "e4m3fn"
        self.calls.append("rms_norm")
        r = self.ref.rms_norm(x, weight, eps, residual=residual, quant=None if quant == "none" else quant,
                              fp8_format=fmt)
        if quant == "per_token":
            return r[0], r[1]
        return (r if residual is None else r[0]), self._none(x)

    def quantize_fp8(self, x, scale, mode, fmt):
        assert scale is None and mode == "token"
        self.calls.append("quantize_fp8")
        return self.ref.quantize_fp8(x, granularity=mode, fp8_format=fmt)

    def skinny_gemm(self, a, w, scale_a, scale_w, out_dtype):
        assert a.is_contiguous() and isinstance(out_dtype, str)
        self.calls.append("skinny_gemm")
        return self.ref.skinny_gemm(a, w, scale_a=scale_a, scale_w=scale_w, out_dtype=getattr(torch, out_dtype))

    def swiglu(self, gate_up, scale, quant, fmt):
        assert scale is None
        self.calls.append("swiglu")
        r = self.ref.swiglu(gate_up, quant=None if quant == "none" else quant, fp8_format=fmt)
        return r if quant == "per_token" else (r, self._none(gate_up))

    def skinny_gemm_residual(self, a, w, residual, scale_a, scale_w):
        self.calls.append("skinny_gemm_residual")
        self.ref.skinny_gemm_residual(a, w, residual, scale_a=scale_a, scale_w=scale_w)

    def decode_attention(self, q, k, v, mask, scale, causal):
        assert isinstance(scale, float) and isinstance(causal, bool)
        self.calls.append("decode_attention")
        return self.ref.decode_attention(q, k, v, mask, scale=scale, causal=causal)

    def decode_attention_rope(self, q, k, v, cos, sin, k_cache, v_cache, position, mask, scale, advance):
        assert isinstance(scale, float) and isinstance(advance, bool)
        self.calls.append("decode_attention_rope")
        return self.ref.decode_attention_rope(q, k, v, cos, sin, k_cache, v_cache, position, mask, scale=scale,
                                              advance=advance)


def _family_models(family):
    cfgs = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
            "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}
    model = _tiny(*cfgs[family]).float()
    stock = _tiny(*cfgs[family]).float()
    stock.load_state_dict(model.state_dict())
    return model.to(torch.bfloat16), stock.to(torch.bfloat16)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("path", ["public", "traced"])
def test_patched_decode_wiring_against_the_stock_model(monkeypatch, family, fp8, path):
    """Prefill (stock code: more rows than the decode kernels take) then decode steps through the patched
    forwards, with the ops replaced by torch references: logits stay close to the stock model's. `public`: the
    ops as rocjit.ops' public functions (eager); `traced`: as torch.ops.rocjit.* custom ops, the calls the
    patched forwards make while torch.compile traces them."""
    model, stock = _family_models(family)
    calls = []
    if path == "public":
        recorder = _Recorder(calls)
        monkeypatch.setattr(rt, "_ops", lambda: recorder)
    else:
        monkeypatch.setattr(rt, "_ops", lambda: rt._TRACED_OPS)
        monkeypatch.setattr(rt, "_custom_ops", lambda: _ReferenceCustomOps(calls))
    monkeypatch.setattr(rt, "_on_device", lambda t: True)
    rt.patch(model, fp8=fp8)
    ids = torch.randint(0, 100, (1, 40))          # 40 rows > 32: the prefill runs the model's own MLP / attention
    with torch.no_grad():
        outs = []
        for m in (stock, model):
            cache = transformers.DynamicCache(config=m.config)
            logits = [m(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]]
            tok = logits[0].argmax(-1, keepdim=True)
            for i in range(3):
                step = m(input_ids=tok, past_key_values=cache, use_cache=True).logits[:, -1]
                logits.append(step)
                tok = step.argmax(-1, keepdim=True)        # both follow their own greedy tokens
            outs.append(torch.stack(logits).float())
    ref, got = outs
    err = ((got - ref).norm() / ref.norm()).item()
    assert err < (0.08 if fp8 else 0.02), err
    layers = model.config.num_hidden_layers
    assert calls.count("decode_attention") == 3 * layers        # the decode steps' attention
    # per step and layer: q/k/v and gate/up (and o_proj in FP8); per step: lm_head
    assert calls.count("skinny_gemm") == 3 * (layers * (3 if fp8 else 2) + 1)
    if fp8:
        # decode: the input norm quantizes for the fused q/k/v GEMM (no separate quantize_fp8 but o_proj's)
        assert calls.count("quantize_fp8") == 3 * layers
        assert calls.count("skinny_gemm_residual") == 3 * layers
    else:
        assert "quantize_fp8" not in calls and calls.count("skinny_gemm_residual") == 3 * layers


@pytest.mark.parametrize("fp8", [False, True])
def test_traced_ops_compile_fullgraph_against_the_stock_model(monkeypatch, fp8):
    """torch.compile(fullgraph=True) over StaticCache traces the patched decode through _TracedOps (the custom ops
    stood in for by the torch references, the kernels' CPU-free wiring): the compiled steps' logits stay close to
    the stock model's, fed the same tokens."""
    model, stock = _family_models("llama")
    calls = []
    monkeypatch.setattr(rt, "_ops", lambda: rt._TRACED_OPS)
    monkeypatch.setattr(rt, "_custom_ops", lambda: _ReferenceCustomOps(calls))
    monkeypatch.setattr(rt, "_on_device", lambda t: True)
    rt.patch(model, fp8=fp8)
    ids = torch.randint(0, 100, (1, 40), generator=torch.Generator().manual_seed(2))
    toks = torch.randint(0, 100, (3, 1, 1), generator=torch.Generator().manual_seed(3))
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            ref_cache = transformers.DynamicCache(config=stock.config)
            stock(input_ids=ids, past_key_values=ref_cache, use_cache=True)
            ref = torch.stack([stock(input_ids=t, past_key_values=ref_cache, use_cache=True).logits[:, -1]
                               for t in toks]).float()
            cache = transformers.StaticCache(config=model.config, max_cache_len=48)
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            step = torch.compile(lambda t, p: model(input_ids=t, past_key_values=cache, cache_position=p,
                                                    use_cache=True).logits, fullgraph=True, backend="eager")
            calls.clear()
            got = torch.stack([step(t, torch.tensor([40 + i]))[:, -1] for i, t in enumerate(toks)]).float()
    finally:
        torch._dynamo.reset()
    # a static cache's decode token: rotary, cache write and attention in one op (no decode_attention)
    assert "skinny_gemm_residual" in calls and ("quantize_fp8" in calls) == fp8
    assert calls.count("decode_attention_rope") == 3 * model.config.num_hidden_layers
    assert "decode_attention" not in calls
    err = ((got - ref).norm() / ref.norm()).item()
    assert err < (0.08 if fp8 else 0.02), err


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_static_cache_decode_writes_the_cache_as_the_stock_model(monkeypatch, family):
    """Eager decode over StaticCache: the fused rotary + cache write + attention (decode_attention_rope, where the
    family allows it: not Qwen3, whose q / k norms come before the rotary) leaves the cache as the stock model's
    update does -- the same keys and values at the same positions, the same length -- and logits close to it."""
    model, stock = _family_models(family)
    calls = []
    recorder = _Recorder(calls)
    monkeypatch.setattr(rt, "_ops", lambda: recorder)
    monkeypatch.setattr(rt, "_on_device", lambda t: True)
    rt.patch(model)
    ids = torch.randint(0, 100, (2, 36), generator=torch.Generator().manual_seed(5))
    toks = torch.randint(0, 100, (3, 2, 1), generator=torch.Generator().manual_seed(6))
    caches, logits = [], []
    with torch.no_grad():
        for m in (stock, model):
            cache = transformers.StaticCache(config=m.config, max_cache_len=48)
            m(input_ids=ids, past_key_values=cache, use_cache=True)
            logits.append(torch.stack([m(input_ids=t, past_key_values=cache, use_cache=True).logits[:, -1]
                                       for t in toks]).float())
            caches.append(cache)
    ref, got = logits
    assert ((got - ref).norm() / ref.norm()).item() < 0.02
    fused = family != "qwen3"
    assert calls.count("decode_attention_rope") == (3 * model.config.num_hidden_layers if fused else 0)
    for a, b in zip(caches[0].layers, caches[1].layers):
        assert int(a.cumulative_length) == int(b.cumulative_length) == 39
        for x, y in ((a.keys, b.keys), (a.values, b.values)):
            assert torch.equal(x[:, :, 39:], y[:, :, 39:])          # the slots past the length: untouched zeros
            err = (x[:, :, :39].float() - y[:, :, :39].float()).abs().max().item()
            assert err <= 0.05 * x[:, :, :39].float().abs().max().item()


def test_lm_head_is_patched_only_as_a_plain_bias_free_linear():
    """A tied lm_head (the embedding's weight) is patched; a Linear subclass or one with a bias keeps its forward,
    and unpatch restores the patched one."""
    tied = _tiny(tie_word_embeddings=True)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    rt.patch(tied)
    assert _swapped(tied.lm_head)
    rt.unpatch(tied)
    assert not _swapped(tied.lm_head) and "_rocjit_patch" not in tied.lm_head.__dict__

    class Head(torch.nn.Linear):
        pass
    for head in (Head(64, 100, bias=False), torch.nn.Linear(64, 100, bias=True)):
        model = _tiny()
        model.lm_head = head.to(torch.bfloat16)
        rt.patch(model)
        assert not _swapped(model.lm_head)
        rt.unpatch(model)


@pytest.mark.parametrize("grad", [False, True])
def test_the_stock_fallback_compiles_fullgraph(grad):
    """Where a patched module runs the model's own forward (here: inputs on the CPU; on a GPU: grad mode on, e.g. a
    compiled step called without torch.no_grad), torch.compile(fullgraph=True) traces that path too, and its
    logits are the stock model's."""
    model, stock = _family_models("llama")
    rt.patch(model, fp8=True)
    ids = torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(4))
    torch._dynamo.reset()
    try:
        with torch.set_grad_enabled(grad):
            ref = stock(input_ids=ids).logits.float()
            got = torch.compile(lambda t: model(input_ids=t).logits, fullgraph=True, backend="eager")(ids).float()
    finally:
        torch._dynamo.reset()
    assert got.shape == ref.shape and torch.equal(got, ref)


@pytest.mark.parametrize("impl", ["sdpa", "eager", "other"])
@pytest.mark.parametrize("attention", [True, False])
def test_decode_attention_replaces_only_sdpa_and_eager(monkeypatch, impl, attention):
    """The model's attention function is replaced by decode_attention only where it is transformers' own sdpa or
    eager function (eager gets an additive mask, sdpa a boolean one or none) and patch(attention=True): logits
    against the stock model with the same attention implementation, over a static cache (masked keys) and a
    dynamic one."""
    model, stock = _family_models("llama")
    name = impl
    if impl == "other":      # a function registered by a user: never replaced
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        AttentionInterface.register("rocjit_test_other", lambda *a, **k: sdpa_attention_forward(*a, **k))
        name = "rocjit_test_other"
    for m in (model, stock):
        m.config._attn_implementation = name
    calls = []
    recorder = _Recorder(calls)
    monkeypatch.setattr(rt, "_ops", lambda: recorder)
    monkeypatch.setattr(rt, "_on_device", lambda t: True)
    rt.patch(model, attention=attention)
    ids = torch.randint(0, 100, (1, 20), generator=torch.Generator().manual_seed(5))
    toks = torch.randint(0, 100, (3, 1, 1), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        for make in (lambda m: transformers.DynamicCache(config=m.config),
                     lambda m: transformers.StaticCache(config=m.config, max_cache_len=31)):
            outs = []
            for m in (stock, model):
                cache = make(m)
                m(input_ids=ids, past_key_values=cache, use_cache=True)
                outs.append(torch.stack([m(input_ids=t, past_key_values=cache, cache_position=torch.tensor([20 + i]),
                                           use_cache=True).logits[:, -1] for i, t in enumerate(toks)]).float())
            ref, got = outs
            assert ((got - ref).norm() / ref.norm()).item() < 0.02
    used = calls.count("decode_attention") + calls.count("decode_attention_rope")
    # per layer, both caches: the prefill (20 tokens, within max_m) and 3 decode steps; but sdpa's static-cache
    # prefill gets no mask and is_causal over a 31-key cache (top-left causal): the model's function runs it.
    # The static cache's decode steps are decode_attention_rope (rotary and cache write in the same op)
    layers = model.config.num_hidden_layers
    want = {"sdpa": 7, "eager": 8, "other": 0}[impl] * layers
    assert used == (want if attention else 0), used
    assert calls.count("decode_attention_rope") == (3 * layers if attention and impl != "other" else 0)


def _inductor_kernels(model, steps=2):
    """The kernels inductor generates for a compiled StaticCache decode step of the patched model on the CPU,
    with torch.ops.rocjit.* running the torch references there (a CPU kernel registered for each, for the length
    of the call), and the logits of each step."""
    from torch._inductor.utils import run_and_get_code
    calls = []
    ref = _ReferenceCustomOps(calls)
    lib = torch.library.Library("rocjit", "IMPL")
    try:
        for name in ("rms_norm", "quantize_fp8", "skinny_gemm", "swiglu", "skinny_gemm_residual",
                     "decode_attention", "decode_attention_rope"):
            lib.impl(name, getattr(ref, name), "CPU")
        cache = transformers.StaticCache(config=model.config, max_cache_len=48)
        ids = torch.randint(0, 100, (1, 40), generator=torch.Generator().manual_seed(2))
        torch._dynamo.reset()
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            step = torch.compile(lambda t: model(input_ids=t, past_key_values=cache, use_cache=True).logits,
                                 fullgraph=True)
            tok = torch.tensor([[7]])
            _, codes = run_and_get_code(step, tok)
            logits = [step(tok)[:, -1].float() for _ in range(steps)]
    finally:
        lib._destroy()
        torch._dynamo.reset()
    kernels = sum(len(re.findall(r"^(cpp_fused_\w+) = async_compile", c, re.M)) for c in codes)
    rope_args = [_call_args(line) for c in codes for line in c.splitlines()
                 if "torch.ops.rocjit.decode_attention_rope.default(" in line]
    return kernels, rope_args, calls, [layer.cumulative_length.item() for layer in cache.layers], logits


def _call_args(line):
    """The top-level arguments of the call on a line of generated code, as text."""
    body = line[line.index("(") + 1:]
    args, depth, cur = [], 0, ""
    for ch in body:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return args + [cur.strip()]


@pytest.mark.parametrize("fp8", [False, True])
def test_inductor_kernels_do_not_grow_with_the_layers(monkeypatch, fp8):
    """Compiled by inductor, a static-cache decode step of a patched Llama leaves every per-layer step to rocjit's
    ops: each layer's cache length grows inside the attention op (advance=True, no add after it), and the rotary
    tables and the mask are computed once, every layer's op reading the same buffers (with an add of the length
    after each layer, which the mask reads, inductor had made a copy of them beside each op). So a 3-layer model
    compiles to as many inductor kernels as a 1-layer one."""
    monkeypatch.setattr(rt, "_on_device", lambda t: True)
    monkeypatch.setattr(rt, "_ops", lambda: rt._TRACED_OPS)      # the prefill too: torch.ops.rocjit.* on the CPU
    counts = {}
    for layers in (1, 3):
        model = _tiny(num_hidden_layers=layers)
        rt.patch(model, fp8=fp8)
        counts[layers], rope_args, calls, lengths, logits = _inductor_kernels(model)
        # every layer's op gets the same cos, sin and mask buffers, and grows its own length (advance=True)
        assert len(rope_args) == layers
        assert all([a[i] for i in (3, 4, 8)] == [rope_args[0][i] for i in (3, 4, 8)] for a in rope_args), rope_args
        assert all(a[-1] == "True" for a in rope_args) and len({a[7] for a in rope_args}) == layers, rope_args
        # the captured step and the two steps after it, every layer's length one further each time (once)
        assert lengths == [40 + 3] * layers, lengths
        assert calls.count("decode_attention_rope") >= layers and all(torch.isfinite(x).all() for x in logits)
    assert counts[3] == counts[1], counts
