"""rocjit.integrations.transformers on the GPU: random-init small models of each family, patched against stock.

Tolerances (stated here, measured on an H100):
- bf16: logits within 3% (relative L2) of a float32 run of the stock model, and no more than twice the stock bf16
  model's own error (+1%); greedy decoding over 32 steps picks the stock model's token at every step decided by
  more than twice the bf16 noise of that step (eager, DynamicCache; see the test).
- FP8 (e4m3 weights per output channel, activations per token): logits within 35% relative L2 of the float32
  stock model. e4m3 keeps 3 mantissa bits (up to 6.25% rounding per element, ~2-3% RMS per GEMM); a random-init
  model's residual stream carries that error through every layer into near-flat logits, so the bound is loose by
  nature; a wrong scale or layout gives errors of 100% and more.
- compiled (StaticCache + torch.compile(fullgraph=True)): patched logits against the float32 stock reference with
  the same bounds, not against the eager run.
"""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.gpu

from rocjit.integrations import transformers as rt  # noqa: E402

FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
}


def _model(family, seed=0):
    cfg_cls, model_cls = FAMILIES[family]
    cfg = cfg_cls(hidden_size=256, intermediate_size=704, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  num_hidden_layers=2, vocab_size=1000, max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = model_cls(cfg).to(torch.bfloat16).eval()
    return model


def _rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def _reference_logits(model, ids):
    """The stock model in float32 (a copy), the reference both bf16 runs are held to."""
    import copy
    ref = copy.deepcopy(model).float()
    with torch.no_grad():
        out = ref(ids).logits
    del ref
    return out


def _greedy(model, ids, steps, follow=None):
    """Greedy decoding with a KV cache, one token a step: (logits of each step [steps, vocab], tokens). With
    `follow`, the tokens fed back are those (teacher forcing), so two models decode the same sequence."""
    cache = transformers.DynamicCache(config=model.config)
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]
    out, toks = [logits], [logits.argmax(-1).view(())]        # each step's own choice
    for i in range(steps - 1):
        tok = toks[-1] if follow is None else follow[i]
        logits = model(input_ids=tok.view(1, 1), past_key_values=cache, use_cache=True).logits[:, -1]
        out.append(logits)
        toks.append(logits.argmax(-1).view(()))
    return torch.cat(out).float(), torch.stack(toks)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_bf16_logits_and_greedy_tokens(family):
    """Logits against float32; greedy decoding over 32 steps. A random-init model's logits are nearly flat, so
    two bf16 models (stock and patched) may rank a near-tie differently: the patched model, fed the stock model's
    tokens, must choose the stock model's token at every step whose top-2 gap exceeds 5% of that step's logit
    spread (std), a margin no bf16 rounding difference should cross; closer ties may differ."""
    model = _model(family)
    ids = torch.randint(0, 1000, (1, 12), device="cuda", generator=torch.Generator("cuda").manual_seed(7))
    ref = _reference_logits(model, ids)
    with torch.no_grad():
        stock = model(ids).logits
        stock_steps, stock_tokens = _greedy(model, ids, 32)
        rt.patch(model)
        patched = model(ids).logits
        ours_steps, ours_tokens = _greedy(model, ids, 32, follow=stock_tokens)
    err_stock, err_ours = _rel(stock, ref), _rel(patched, ref)
    assert err_ours < 0.03 and err_ours < 2 * err_stock + 0.01, (err_ours, err_stock)
    top2 = stock_steps.topk(2, dim=-1).values
    gap = top2[:, 0] - top2[:, 1]
    decided = gap > 0.05 * stock_steps.std(-1)
    assert int(decided.sum()) >= 16, "too few steps are decided clearly for the test to mean anything"
    agree = ours_tokens == stock_tokens
    assert bool(agree[decided].all()), (agree.tolist(), gap.tolist())
    assert _rel(ours_steps, stock_steps) < 0.03
    rt.unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, stock)            # unpatched: the stock model again, bit for bit


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fp8_error_bound(family):
    model = _model(family)
    ids = torch.randint(0, 1000, (1, 9), device="cuda", generator=torch.Generator("cuda").manual_seed(3))
    ref = _reference_logits(model, ids)
    rt.patch(model, fp8=True)
    with torch.no_grad():
        fp8 = model(ids).logits
        one = model(ids[:, :1]).logits                             # the decode path (one token) too
        out = model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert not torch.isnan(fp8).any() and out.shape == (1, 17)
    assert _rel(fp8, ref) < 0.35
    assert _rel(one, ref[:, :1]) < 0.35
    rt.unpatch(model)


def test_patched_forward_falls_back_where_gradients_are_needed():
    model = _model("llama")
    rt.patch(model)
    ids = torch.randint(0, 1000, (1, 5), device="cuda")
    model.train()
    loss = model(ids, labels=ids).loss
    loss.backward()                                              # stock code ran: gradients exist
    assert model.model.layers[0].mlp.down_proj.weight.grad is not None
    rt.unpatch(model)


def test_the_gradient_fallback_compiles_fullgraph():
    """A compiled forward with gradients on (no torch.no_grad) runs the stock code of every patched module, traced
    in one graph; its logits are the stock model's."""
    model = _model("llama", seed=2)
    rt.patch(model, fp8=True)
    ids = torch.randint(0, 1000, (1, 6), device="cuda", generator=torch.Generator("cuda").manual_seed(6))
    torch._dynamo.reset()
    try:
        got = torch.compile(lambda t: model(input_ids=t).logits, fullgraph=True, backend="eager")(ids)
    finally:
        torch._dynamo.reset()
    assert got.requires_grad
    ref = model_stock_copy(model)(input_ids=ids).logits
    assert torch.equal(got, ref)
    rt.unpatch(model)


@pytest.mark.parametrize("fp8", [False, True])
def test_static_cache_and_torch_compile_fullgraph(fp8):
    """Compiled decode steps (the ops traced as torch.ops.rocjit.* custom ops) against the float32 stock model."""
    model = _model("llama", seed=1)
    ids = torch.randint(0, 1000, (1, 8), device="cuda", generator=torch.Generator("cuda").manual_seed(5))
    rt.patch(model, fp8=fp8)
    cache = transformers.StaticCache(config=model.config, max_cache_len=64)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        tok = ids[:, -1:]
        step = torch.compile(lambda t, p: model(input_ids=t, past_key_values=cache, cache_position=p,
                                                use_cache=True).logits, fullgraph=True)
        seq = ids
        for i in range(4):
            pos = torch.tensor([ids.shape[1] + i], device="cuda")
            logits = step(tok, pos)
            seq = torch.cat([seq, tok], 1)
            ref = _reference_logits(model_stock_copy(model), seq)[:, -1:]
            assert _rel(logits, ref) < (0.35 if fp8 else 0.03)
            tok = logits.argmax(-1)
    rt.unpatch(model)


def model_stock_copy(model):
    """A stock (unpatched) copy of a patched model, for reference runs."""
    import copy
    c = copy.deepcopy(model)
    rt.unpatch(c)
    return c


@pytest.mark.parametrize("compiled", [False, True])
def test_static_cache_decode_fuses_rotary_and_cache_write(monkeypatch, compiled):
    """A decode token over StaticCache takes ops.decode_attention_rope (rotary, cache write and attention in one
    kernel): the cache ends as the stock model's update leaves it (same positions, same length, keys and values
    within bf16 noise) and the logits stay within the bf16 bound of the float32 stock model."""
    import copy
    model = _model("llama", seed=2)
    stock = copy.deepcopy(model)
    rt.patch(model)
    traced = []
    real = rt._TRACED_OPS.decode_attention_rope
    monkeypatch.setattr(rt._TRACED_OPS, "decode_attention_rope",
                        lambda *a, **k: (traced.append(1), real(*a, **k))[1])
    calls = []
    real_public = rt._ops

    def counting_ops():
        ops = real_public()
        if ops is rt._TRACED_OPS:
            return ops

        class Counting:
            def __getattr__(self, name):
                fn = getattr(ops, name)
                return (lambda *a, **k: (calls.append(name), fn(*a, **k))[1]) if name == "decode_attention_rope" \
                    else fn
        return Counting()
    monkeypatch.setattr(rt, "_ops", counting_ops)
    ids = torch.randint(0, 1000, (2, 9), device="cuda", generator=torch.Generator("cuda").manual_seed(7))
    steps = 4
    caches, logits = [], []
    with torch.no_grad():
        for m in (stock, model):
            cache = transformers.StaticCache(config=m.config, max_cache_len=40)
            m(input_ids=ids, past_key_values=cache, use_cache=True)
            fn = (lambda t, p, m=m, cache=cache: m(input_ids=t, past_key_values=cache, cache_position=p,
                                                     use_cache=True).logits)
            if compiled and m is model:
                fn = torch.compile(fn, fullgraph=True)
            tok, seq, out = ids[:, -1:], ids, []
            for i in range(steps):
                lg = fn(tok, torch.tensor([ids.shape[1] + i], device="cuda"))
                seq = torch.cat([seq, tok], 1)
                out.append(lg[:, -1:].clone())
                tok = ids[:, i:i + 1]            # both models fed the same tokens
            caches.append(cache)
            logits.append(torch.cat(out, 1))
    assert (traced if compiled else calls), "decode_attention_rope was not used"
    n = ids.shape[1] + steps
    for a, b in zip(caches[0].layers, caches[1].layers):
        assert int(a.cumulative_length) == int(b.cumulative_length) == n
        for x, y in ((a.keys, b.keys), (a.values, b.values)):
            assert torch.equal(x[:, :, n:], y[:, :, n:])
            assert _rel(y[:, :, :n], x[:, :, :n]) < 0.02
    assert _rel(logits[1], logits[0]) < 0.03
    rt.unpatch(model)
