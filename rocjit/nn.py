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
"""
from __future__ import annotations

import math

import torch

from rocjit.ops.gemm_fp8 import gemm_fp8_blockwise
from rocjit.ops.quant import quantize_fp8_dual, quantize_fp8_weight


def _half(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype in (torch.bfloat16, torch.float16) else t.to(torch.bfloat16)


class _FP8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        if x.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"FP8Linear: input must be bfloat16 or float16, got {x.dtype}")
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        xq, xs, xq_t, xs_t = quantize_fp8_dual(x2, transpose_col=True)
        wq, ws, wq_t = quantize_fp8_weight(_half(weight).contiguous(), transposed=True)
        y = gemm_fp8_blockwise(xq, xs, wq, ws, layout="NT", out_dtype=x.dtype)
        if bias is not None:
            y = y + bias.to(y.dtype)
        ctx.save_for_backward(xq_t, xs_t, wq_t, ws)
        ctx.has_bias = bias is not None
        ctx.shapes = (shape, weight.dtype, bias.dtype if bias is not None else None)
        return y.reshape(*shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, gy):
        xq_t, xs_t, wq_t, ws = ctx.saved_tensors
        shape, wdtype, bdtype = ctx.shapes
        n_out = gy.shape[-1]
        g2 = _half(gy).reshape(-1, n_out)
        if not g2.is_contiguous():
            g2 = g2.contiguous()
        gq, gs, gq_t, gs_t = quantize_fp8_dual(g2, transpose_col=True)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            # dgrad NN: a = dy [M, N_out], b = W as [K = N_out, N = K_in], K-major in memory (W^T's copy)
            gx = gemm_fp8_blockwise(gq, gs, wq_t.t(), ws, layout="NN", out_dtype=g2.dtype).reshape(shape)
        if ctx.needs_input_grad[1]:
            # wgrad TN: a = dy as [K = tokens, M = N_out], b = x as [K = tokens, N = K_in], both K-major copies
            gw = gemm_fp8_blockwise(gq_t.t(), gs_t.t(), xq_t.t(), xs_t.t(), layout="TN", out_dtype=wdtype
                                    if wdtype in (torch.bfloat16, torch.float16, torch.float32) else torch.float32)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.float().sum(0).to(bdtype)
        return gx, gw, gb


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x W^T (+ bias) with blockwise FP8 forward and backward (see the module docstring)."""
    return _FP8LinearFunction.apply(x, weight, bias)


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
        with torch.no_grad():
            m.weight.copy_(linear.weight)
            if linear.bias is not None:
                m.bias.copy_(linear.bias)
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, fp8=blockwise"
