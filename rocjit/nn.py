"""FP8 training layers: `FP8Linear`, a drop-in `torch.nn.Linear` whose three GEMMs run in blockwise-scaled FP8.

    layer = rocjit.nn.FP8Linear(4096, 14336, bias=False)        # bf16 master weight
    layer = rocjit.nn.FP8Linear.from_linear(torch_linear)        # same parameters, FP8 compute

Per step (the DeepSeek-V3 recipe, through rocjit.ops.gemm_fp8_blockwise):
- forward (NT):  y = x W^T. x is quantized 1 x 128 along its features and, in the same launch, 128 x 1 along
  tokens into a transposed (token-contiguous) copy kept for wgrad (quantize_fp8_dual(transpose_col=True));
  W is quantized in 128 x 128 tiles together with its transposed copy (quantize_fp8_weight(transposed=True)).
- dgrad (NN):    dx = dy W. dy is quantized like x (row blocks for dgrad, transposed column blocks for wgrad).
- wgrad (TN):    dW = dy^T x, both operands scaled 1 x 128 along tokens.
Only FP8 copies are saved for backward (no bf16 activation). Master weights and gradients stay in the
parameter's dtype (bfloat16 by default). Inputs must be float16 / bfloat16 (the quantizers' inputs).
A copy the backward will not read is not made: without grad mode (inference), or for a frozen weight (no
x^T copy for wgrad) or an input that takes no gradient (no W^T copy for dgrad), the forward quantizes x by row
blocks alone (quantize_fp8_dual(columns=False)) and W without its transposed copy.

`FP8MLP` is Linear -> activation -> Linear (GELU, tanh-GELU, SiLU or ReLU) in one autograd function, with the
activation fused into the quantizers (quantize_fp8_dual(activation=...)): the forward quantizes act(z) straight
from the first GEMM's output z, so act(z) is never written in bf16 and no activation kernel runs. The backward
quantizes grad_h * act'(z) straight from the second GEMM's dgrad (quantize_fp8_dual(z, activation=, grad=)), so the
activation's gradient is not written either; only where fc1's bias takes a gradient, which needs that tensor
itself, does it run torch's activation backward and the plain quantizer. (H200, 8192 x 14336: GELU's backward fused
302 us against 357 for torch's backward and the quantizer; in the whole training step a tie within the rounds'
spread. With torch's erff form the fused one took 372 and only ReLU's was fused; see quant_fp8.hip.)
It saves z (bf16) for the backward, as torch's activation saves its input.

    mlp = rocjit.nn.FP8MLP(4096, 14336, activation="gelu", bias=False)
    mlp = rocjit.nn.FP8MLP.from_sequential(torch.nn.Sequential(fc1, torch.nn.GELU(), fc2))
"""
from __future__ import annotations

import math

import torch

from rocjit.ops.gemm_fp8 import gemm_fp8_blockwise
from rocjit.ops.quant import ACTIVATIONS, quantize_fp8_dual, quantize_fp8_weight


def _half(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype in (torch.bfloat16, torch.float16) else t.to(torch.bfloat16)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as a contiguous [rows, features] matrix."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.is_contiguous() else t2.contiguous()


def _wgrad_dtype(wdtype):
    return wdtype if wdtype in (torch.bfloat16, torch.float16, torch.float32) else torch.float32


def _check_input(x: torch.Tensor, layer: str, in_features: int) -> None:
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"{layer}: input must be bfloat16 or float16, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != in_features:
        raise ValueError(f"{layer}: input's last dimension must be in_features = {in_features}, got shape "
                         f"{tuple(x.shape)}")


def _fp8_nt(a2, weight, bias, out_dtype, keep_a, keep_w, activation=None):
    """y = act(a2) W^T (+ bias), the forward product in FP8 (NT) -> (y, the K-major copies the backward reads:
    act(a2)'s column-quantized transpose and its scales (keep_a: W's gradient needs them), W's transposed copy
    (keep_w: the input's gradient needs it), W's tile scales). A copy not kept is not made (None): inference and
    frozen layers run only the quantization the forward product needs."""
    aq, a_s, aq_t, as_t = quantize_fp8_dual(a2, transpose_col=keep_a, activation=activation, columns=keep_a)
    wq, ws, *wq_t = quantize_fp8_weight(_half(weight).contiguous(), transposed=keep_w)
    y = gemm_fp8_blockwise(aq, a_s, wq, ws, layout="NT", out_dtype=out_dtype)
    if bias is not None:
        y.add_(bias.to(y.dtype))
    return y, aq_t, as_t, (wq_t[0] if keep_w else None), ws


def _needs(ctx, grad_enabled, n):
    """Which of the first n inputs the backward will differentiate: none when the call ran without grad mode (the
    function's ctx.needs_input_grad says what requires grad, also under torch.no_grad())."""
    return tuple(bool(grad_enabled and g) for g in ctx.needs_input_grad[:n])


class _FP8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, grad_enabled):
        _check_input(x, "FP8Linear", weight.shape[1])
        shape = x.shape
        need_x, need_w = _needs(ctx, grad_enabled, 2)
        y, xq_t, xs_t, wq_t, ws = _fp8_nt(_rows(x), weight, bias, x.dtype, keep_a=need_w, keep_w=need_x)
        ctx.save_for_backward(xq_t, xs_t, wq_t, ws)
        ctx.has_bias = bias is not None
        ctx.shapes = (shape, weight.dtype, bias.dtype if bias is not None else None)
        return y.reshape(*shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, gy):
        xq_t, xs_t, wq_t, ws = ctx.saved_tensors
        shape, wdtype, bdtype = ctx.shapes
        need_x, need_w = ctx.needs_input_grad[:2]
        g2 = _rows(_half(gy))
        gx = gw = gb = None
        if need_x or need_w:    # rows for dgrad, the transposed column blocks for wgrad
            gq, gs, gq_t, gs_t = quantize_fp8_dual(g2, transpose_col=need_w, columns=need_w)
        if need_x:
            # dgrad NN: a = dy [M, N_out], b = W as [K = N_out, N = K_in], K-major in memory (W^T's copy)
            gx = gemm_fp8_blockwise(gq, gs, wq_t.t(), ws, layout="NN", out_dtype=g2.dtype).reshape(shape)
        if need_w:
            # wgrad TN: a = dy as [K = tokens, M = N_out], b = x as [K = tokens, N = K_in], both K-major copies
            gw = gemm_fp8_blockwise(gq_t.t(), gs_t.t(), xq_t.t(), xs_t.t(), layout="TN", out_dtype=_wgrad_dtype(wdtype))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.float().sum(0).to(bdtype)
        return gx, gw, gb, None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x W^T (+ bias) with blockwise FP8 forward and backward (see the module docstring)."""
    return _FP8LinearFunction.apply(x, weight, bias, torch.is_grad_enabled())


class FP8Linear(torch.nn.Module):
    """torch.nn.Linear with blockwise-scaled FP8 GEMMs in forward, dgrad and wgrad; parameters (the master
    weights) in `dtype` (bfloat16 by default), initialised like torch.nn.Linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=torch.bfloat16):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> "FP8Linear":
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, device=linear.weight.device,
                dtype=linear.weight.dtype)
        m._copy_from(linear)
        return m

    def _copy_from(self, linear: torch.nn.Linear) -> None:
        with torch.no_grad():
            self.weight.copy_(linear.weight)
            if linear.bias is not None:
                self.bias.copy_(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, fp8=blockwise"


def _check_activation(layer: str, activation) -> None:
    """activation names one of quantize_fp8_dual's activations (an MLP has one: None is not among them)."""
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        allowed = ", ".join(repr(a) for a in ACTIVATIONS if a is not None)
        raise ValueError(f"{layer}: activation must be one of {allowed}, got {activation!r}")


# the activations whose backward FP8MLP fuses into the quantizer: every one it takes (see the module docstring)
_FUSED_BACKWARD = frozenset(a for a in ACTIVATIONS if a is not None)


def _activation_backward(activation: str, grad: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """grad * act'(z) in torch."""
    if activation in ("gelu", "gelu_tanh"):
        return torch.ops.aten.gelu_backward(grad, z, approximate="tanh" if activation == "gelu_tanh" else "none")
    if activation == "silu":
        return torch.ops.aten.silu_backward(grad, z)
    return torch.ops.aten.threshold_backward(grad, z, 0)


class _FP8MLPFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, activation, grad_enabled):
        _check_input(x, "FP8MLP", w1.shape[1])
        shape = x.shape
        need_x, need_w1, need_b1, need_w2, _ = _needs(ctx, grad_enabled, 5)
        below = need_x or need_w1 or need_b1        # the backward goes through fc2's dgrad and the activation
        z, xq_t, xs_t, w1q_t, w1s = _fp8_nt(_rows(x), w1, b1, x.dtype, keep_a=need_w1, keep_w=need_x)
        # act(z) quantized in one read of z
        y, hq_t, hs_t, w2q_t, w2s = _fp8_nt(z, w2, b2, x.dtype, keep_a=need_w2, keep_w=below, activation=activation)
        ctx.save_for_backward(xq_t, xs_t, w1q_t, w1s, z if below else None, hq_t, hs_t, w2q_t, w2s)
        ctx.activation = activation
        ctx.meta = (shape, x.dtype, w1.dtype, w2.dtype, None if b1 is None else b1.dtype,
                    None if b2 is None else b2.dtype)
        return y.reshape(*shape[:-1], w2.shape[0])

    @staticmethod
    def backward(ctx, gy):
        xq_t, xs_t, w1q_t, w1s, z, hq_t, hs_t, w2q_t, w2s = ctx.saved_tensors
        shape, xdtype, w1dtype, w2dtype, b1dtype, b2dtype = ctx.meta
        need_x, need_w1, need_b1, need_w2, need_b2 = ctx.needs_input_grad[:5]
        below = need_x or need_w1 or need_b1
        g2 = _rows(gy.to(xdtype))
        gx = gw1 = gb1 = gw2 = gb2 = None
        if need_w2 or below:    # rows for fc2's dgrad, the transposed column blocks for its wgrad
            gq, gs, gq_t, gs_t = quantize_fp8_dual(g2, transpose_col=need_w2, columns=need_w2)
        if need_w2:     # wgrad of the second Linear (TN): dy^T h, both K-major (tokens) copies
            gw2 = gemm_fp8_blockwise(gq_t.t(), gs_t.t(), hq_t.t(), hs_t.t(), layout="TN", out_dtype=_wgrad_dtype(w2dtype))
        if need_b2:
            gb2 = g2.float().sum(0).to(b2dtype)
        if below:
            # dgrad of the second Linear (NN), then the activation's backward (fused into the quantizer for ReLU
            # without a bias to differentiate); rows for fc1's dgrad, the transposed column blocks for its wgrad
            gh = gemm_fp8_blockwise(gq, gs, w2q_t.t(), w2s, layout="NN", out_dtype=z.dtype)
            gz = None
            if ctx.activation in _FUSED_BACKWARD and not need_b1:
                zq, zs, zq_t, zs_t = quantize_fp8_dual(z, transpose_col=need_w1, activation=ctx.activation, grad=gh,
                                                       columns=need_w1)
            else:
                gz = _activation_backward(ctx.activation, gh, z)
                if need_x or need_w1:
                    zq, zs, zq_t, zs_t = quantize_fp8_dual(gz, transpose_col=need_w1, columns=need_w1)
            if need_x:
                gx = gemm_fp8_blockwise(zq, zs, w1q_t.t(), w1s, layout="NN", out_dtype=z.dtype).reshape(shape)
            if need_w1:
                gw1 = gemm_fp8_blockwise(zq_t.t(), zs_t.t(), xq_t.t(), xs_t.t(), layout="TN",
                                         out_dtype=_wgrad_dtype(w1dtype))
            if need_b1:
                gb1 = gz.float().sum(0).to(b1dtype)
        return gx, gw1, gb1, gw2, gb2, None, None


def fp8_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, b1: torch.Tensor | None = None,
            b2: torch.Tensor | None = None, activation: str = "gelu") -> torch.Tensor:
    """act(x W1^T + b1) W2^T + b2 with blockwise FP8 GEMMs and the activation fused into the quantizers
    (see the module docstring); activation: "gelu", "gelu_tanh", "silu" or "relu"."""
    _check_activation("fp8_mlp", activation)
    if w2.shape[1] != w1.shape[0]:
        raise ValueError(f"fp8_mlp: w2 must be [out_features, {w1.shape[0]}] (w1's out_features), got "
                         f"{tuple(w2.shape)}")
    return _FP8MLPFunction.apply(x, w1, b1, w2, b2, activation, torch.is_grad_enabled())


# torch modules -> the activation names of quantize_fp8_dual
def _activation_of(module: torch.nn.Module) -> str:
    if isinstance(module, torch.nn.GELU):
        return "gelu_tanh" if module.approximate == "tanh" else "gelu"
    if isinstance(module, torch.nn.SiLU):
        return "silu"
    if isinstance(module, torch.nn.ReLU):
        return "relu"
    raise ValueError(f"FP8MLP: the activation must be torch.nn.GELU, SiLU or ReLU, got {type(module).__name__}")


class FP8MLP(torch.nn.Module):
    """Linear(in, hidden) -> activation -> Linear(hidden, out) with blockwise FP8 GEMMs and the activation fused
    into the quantizers. Parameters as two FP8Linear submodules, fc1 and fc2 (state-dict keys fc1.weight, ...)."""

    def __init__(self, in_features: int, hidden_features: int, out_features: int | None = None, bias: bool = True,
                 activation: str = "gelu", device=None, dtype=torch.bfloat16):
        super().__init__()
        _check_activation("FP8MLP", activation)
        self.activation = activation
        out_features = in_features if out_features is None else out_features
        self.fc1 = FP8Linear(in_features, hidden_features, bias, device=device, dtype=dtype)
        self.fc2 = FP8Linear(hidden_features, out_features, bias, device=device, dtype=dtype)

    @classmethod
    def from_linears(cls, fc1: torch.nn.Linear, fc2: torch.nn.Linear, activation: str = "gelu") -> "FP8MLP":
        """The same parameters (copied) as fc1 -> activation -> fc2."""
        if fc2.in_features != fc1.out_features:
            raise ValueError(f"FP8MLP: fc2.in_features ({fc2.in_features}) must equal fc1.out_features "
                             f"({fc1.out_features})")
        if (fc1.bias is None) != (fc2.bias is None):
            raise ValueError("FP8MLP: fc1 and fc2 must both have a bias or both have none")
        m = cls(fc1.in_features, fc1.out_features, fc2.out_features, fc1.bias is not None, activation,
                device=fc1.weight.device, dtype=fc1.weight.dtype)
        m.fc1._copy_from(fc1)
        m.fc2._copy_from(fc2)
        return m

    @classmethod
    def from_sequential(cls, seq: torch.nn.Sequential) -> "FP8MLP":
        """From torch.nn.Sequential(Linear, GELU / SiLU / ReLU, Linear)."""
        if len(seq) != 3 or not isinstance(seq[0], torch.nn.Linear) or not isinstance(seq[2], torch.nn.Linear):
            raise ValueError(f"FP8MLP.from_sequential: expected Sequential(Linear, activation, Linear), got {seq}")
        return cls.from_linears(seq[0], seq[2], _activation_of(seq[1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_mlp(x, self.fc1.weight, self.fc2.weight, self.fc1.bias, self.fc2.bias, self.activation)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}, fp8=blockwise, activation fused into the quantizers"
