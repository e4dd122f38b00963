"""torch.ops.rocjit.* called directly (as torch.compile graphs and anyone else may): every custom op checks its
arguments as the public function does, so a bad call raises a named error before any kernel runs (checked here
on the CPU, where no kernel could run)."""
import pytest

torch = pytest.importorskip("torch")

import rocjit.ops  # noqa: E402,F401  (registers torch.ops.rocjit.*)

bf16 = torch.bfloat16


def _noncontig(*shape):
    return torch.randn(*shape[:-1], shape[-1] * 2).to(bf16)[..., ::2]


def _raises(match, fn, *args):
    with pytest.raises((ValueError, TypeError), match=match):
        fn(*args)


def test_rms_norm_custom_op_checks_its_arguments():
    op = torch.ops.rocjit.rms_norm
    w = torch.ones(64, dtype=bf16)
    _raises("x must be contiguous", op, _noncontig(4, 64), w, 1e-6, None, None, "none", "e4m3fn")
    _raises("x must have dtype", op, torch.randn(4, 64), w, 1e-6, None, None, "none", "e4m3fn")
    _raises("weight must have shape", op, torch.randn(4, 64).to(bf16), w[:32], 1e-6, None, None, "none", "e4m3fn")
    _raises("residual must be contiguous", op, torch.randn(4, 64).to(bf16), w, 1e-6, _noncontig(4, 64), None,
            "none", "e4m3fn")
    _raises("not a valid combination", op, torch.randn(4, 64).to(bf16), w, 1e-6, None, torch.ones(1), "none",
            "e4m3fn")
    _raises("quant must be", op, torch.randn(4, 64).to(bf16), w, 1e-6, None, None, "per_row", "e4m3fn")
    _raises("not a valid combination", op, torch.randn(4, 64).to(bf16), w, 1e-6, None, None, "per_token", "e5m2")
    _raises("x must be on a GPU", op, torch.randn(4, 64).to(bf16), w, 1e-6, None, None, "none", "e4m3fn")


def test_swiglu_custom_op_checks_its_arguments():
    op = torch.ops.rocjit.swiglu
    _raises("gate_up must be contiguous", op, _noncontig(2, 64), None, "none", "e4m3fn")
    _raises("even last dimension", op, torch.randn(2, 63).to(bf16), None, "none", "e4m3fn")
    _raises("quant='static' needs scale", op, torch.randn(2, 64).to(bf16), None, "static", "e4m3fn")
    _raises("gate_up must be on a GPU", op, torch.randn(2, 64).to(bf16), None, "per_token", "e4m3fn")


def test_quantizer_custom_ops_check_their_arguments():
    _raises("x must be contiguous", torch.ops.rocjit.quantize_fp8, _noncontig(4, 128), None, "token", "e4m3fn")
    _raises("not a valid combination", torch.ops.rocjit.quantize_fp8, torch.randn(4, 128).to(bf16), None,
            "static", "e4m3fn")
    _raises("not a valid combination", torch.ops.rocjit.quantize_fp8, torch.randn(4, 128).to(bf16), None,
            "rows", "e4m3fn")
    _raises("fp8 format must be", torch.ops.rocjit.quantize_fp8, torch.randn(4, 128).to(bf16), None, "token",
            "e5m2x")
    _raises("x must be 2-D", torch.ops.rocjit.quantize_fp8_weight, torch.randn(2, 4, 128).to(bf16), "e4m3fn",
            False)
    _raises("x must have dtype", torch.ops.rocjit.quantize_fp8_dual, torch.randn(4, 128), "e4m3fn", False)
    x = torch.randn(4, 128).to(bf16)
    dual = torch.ops.rocjit.quantize_fp8_dual
    _raises("activation must be one of", dual, x, "e4m3fn", False, "tanh", None)
    _raises("grad= is the upstream gradient", dual, x, "e4m3fn", False, None, x.clone())
    _raises("grad must have shape", dual, x, "e4m3fn", False, "gelu", torch.randn(4, 64).to(bf16))
    _raises("grad must have dtype", dual, x, "e4m3fn", False, "silu", torch.randn(4, 128))
    _raises("grad must be contiguous", dual, x, "e4m3fn", False, "relu", _noncontig(4, 128))


def test_fp8_mlp_checks_its_arguments():
    from rocjit import nn as rnn
    with pytest.raises(ValueError, match="activation must be one of"):
        rnn.FP8MLP(64, 128, activation="tanh")
    with pytest.raises(ValueError, match="activation must be one of"):
        rnn.FP8MLP(64, 128, activation=["gelu"])
    with pytest.raises(ValueError, match="activation must be torch.nn.GELU, SiLU or ReLU"):
        rnn.FP8MLP.from_sequential(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(),
                                                       torch.nn.Linear(128, 64)))
    with pytest.raises(ValueError, match="fc2.in_features"):
        rnn.FP8MLP.from_linears(torch.nn.Linear(64, 128), torch.nn.Linear(96, 64))
    m = rnn.FP8MLP.from_sequential(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU("tanh"),
                                                       torch.nn.Linear(128, 32)))
    assert m.activation == "gelu_tanh" and m.fc2.weight.shape == (32, 128)
    with pytest.raises(ValueError, match="in_features = 64"):
        m(torch.randn(3, 48).to(bf16))
    with pytest.raises(TypeError, match="input must be bfloat16 or float16"):
        m(torch.randn(3, 64))


def test_skinny_custom_ops_check_their_arguments():
    a = torch.randn(2, 64).to(bf16)
    _raises("M <= 32", torch.ops.rocjit.skinny_gemm, torch.randn(33, 64).to(bf16), torch.randn(16, 64).to(bf16),
            None, None, "bfloat16")
    _raises("prepare_gate_up", torch.ops.rocjit.skinny_gemm_swiglu, a, torch.randn(24, 64).to(bf16), None, None,
            None, 12, "bfloat16", "e4m3fn")


def test_only_the_attention_ops_take_any_layout():
    """The attention ops check strides themselves and take any (a static cache, views of one q/k/v output, a mask
    broadcast with zero strides): they carry torch's flexible_layout tag, so inductor may hand every layer the same
    buffer. The other ops want contiguous rows and keep the default, eager strides."""
    from rocjit.ops import _op
    _op.register_custom_ops()
    flexible = {name for name, e in _op.REGISTRY.items() if e.custom_op is not None
                and torch.Tag.flexible_layout in getattr(torch.ops.rocjit, name).default.tags}
    assert flexible == {"decode_attention", "decode_attention_rope"}
    with pytest.raises(TypeError, match="advance must be a bool"):
        rocjit.ops.decode_attention_rope(*([torch.zeros(1)] * 8), advance=1)
