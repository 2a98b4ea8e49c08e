"""Grouped GEMM (Triton persistent kernel; torch._grouped_mm) vs a float64 per-expert loop, fwd + bwd."""
import pytest
import torch

from turbo_util import BAND, DEV, relerr  # noqa: I001
from primus.turbo.grouped_gemm import grouped_gemm, grouped_gemm_reference


@pytest.mark.parametrize("sizes,K,N", [([5, 0, 17, 3], 24, 40), ([33, 1], 16, 20), ([0, 0, 9], 40, 8)])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("provider,dtype", [("triton", torch.float32), ("triton", torch.bfloat16),
                                            ("torch", torch.bfloat16)])
def test_grouped_gemm(sizes, K, N, trans_b, provider, dtype):
    if provider == "torch" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch._grouped_mm missing")
    if provider == "torch" and (K % 8 or N % 8):
        pytest.skip("torch._grouped_mm needs 16-byte aligned K and N")
    G, M = len(sizes), sum(sizes)
    x = torch.randn(M, K, device=DEV).to(dtype).requires_grad_()
    w = (torch.randn(G, N, K) if trans_b else torch.randn(G, K, N)).div(K ** 0.5).to(DEV, dtype).requires_grad_()
    gs = torch.tensor(sizes, device=DEV)
    dy = torch.randn(M, N, device=DEV).to(dtype)
    y = grouped_gemm(x, w, gs, trans_b=trans_b, provider=provider)
    y.backward(dy)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    yr = grouped_gemm_reference(xd, wd, sizes, trans_b=trans_b)
    yr.backward(dy.double())
    tol = 1e-3 if dtype == torch.float32 else BAND[dtype]  # fp32 tl.dot runs as tf32 on a GPU (~3e-4)
    assert relerr(y, yr) < tol
    assert relerr(x.grad, xd.grad) < tol
    assert relerr(w.grad, wd.grad) < tol
