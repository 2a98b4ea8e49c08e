"""Fused RMSNorm (Triton) vs a float64 PyTorch reference, fwd + bwd, on CPU through Triton's interpreter."""
import pytest
import torch

from turbo_util import BAND, DEV, relerr  # noqa: I001  (sets TRITON_INTERPRET before triton imports)
from primus.turbo.rmsnorm import TurboRMSNorm, rms_norm


@pytest.mark.parametrize("shape", [(7, 33), (3, 5, 96), (19, 130)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_fwd_bwd(shape, dtype):
    g = torch.Generator().manual_seed(hash((shape, str(dtype))) % 2**31)
    N = shape[-1]
    x = torch.randn(shape, generator=g).to(DEV, dtype).requires_grad_()
    w = (1 + 0.3 * torch.randn(N, generator=g)).to(DEV, dtype).requires_grad_()
    dy = torch.randn(shape, generator=g).to(DEV, dtype)
    y = rms_norm(x, w, 1e-5)
    y.backward(dy)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    yr = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * wd
    yr.backward(dy.double())
    tol = BAND[dtype]
    assert relerr(y, yr) < tol
    assert relerr(x.grad, xd.grad) < tol
    assert relerr(w.grad, wd.grad) < tol


def test_module_dropin():
    m = TurboRMSNorm(40, eps=1e-6).to(DEV)
    x = torch.randn(6, 40, device=DEV)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert relerr(m(x), ref) < 1e-5
