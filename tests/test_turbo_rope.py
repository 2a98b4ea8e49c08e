"""Fused QKV split + RoPE (primus/turbo/rope.py) vs a float64 reference, forward and backward; torch.compile keeps it
whole (no graph break)."""
import pytest
import torch

from turbo_util import BAND, DEV, assert_compiles_like_eager, relerr  # noqa: I001
from primus.turbo.rope import qkv_rope, qkv_rope_reference


def _freqs(s, d, base=10000.0, offset=0.0):
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    f = torch.outer(torch.arange(s, dtype=torch.float64) + offset, inv)
    return torch.cat((f, f), dim=-1).float().to(DEV)  # megatron's emb = cat(freqs, freqs)


@pytest.mark.parametrize("s,b,ng,r,d", [(5, 3, 2, 3, 16), (7, 2, 1, 1, 6), (4, 2, 3, 2, 64), (9, 1, 2, 4, 24)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qkv_rope_matches_float64(s, b, ng, r, d, dtype):
    torch.manual_seed(0)
    mixed = torch.randn(s, b, ng, (r + 2) * d, device=DEV).to(dtype).requires_grad_()
    qf, kf = _freqs(s, d), _freqs(s, d, offset=3.0)  # different q / k angles exercise both paths
    grads = [torch.randn(b, s, ng * r, d, device=DEV).to(dtype), torch.randn(b, s, ng, d, device=DEV).to(dtype),
             torch.randn(b, s, ng, d, device=DEV).to(dtype)]
    q, k, v = qkv_rope(mixed, qf, kf, r)
    assert q.shape == (b, s, ng * r, d) and k.shape == v.shape == (b, s, ng, d)
    # SDPA hands back gradients in its own layouts: give the backward a non-contiguous one
    torch.autograd.backward([q, k, v], [grads[0], grads[1].transpose(1, 2).contiguous().transpose(1, 2), grads[2]])
    md = mixed.detach().double().requires_grad_()
    ref = qkv_rope_reference(md, qf, kf, r)  # freqs stay fp32 (megatron's contract)
    torch.autograd.backward(list(ref), [g.double() for g in grads])
    tol = BAND[dtype]
    for out, want in zip((q, k, v), ref):
        assert relerr(out, want) < tol
    assert relerr(mixed.grad, md.grad) < tol


def test_v_passes_through_exactly():
    mixed = torch.randn(3, 2, 2, 4 * 8, device=DEV)
    q, k, v = qkv_rope(mixed, _freqs(3, 8), _freqs(3, 8), 2)
    assert torch.equal(v, mixed[..., 3 * 8:].transpose(0, 1))


def test_compiles_without_graph_breaks():
    s, b, ng, r, d = 6, 2, 2, 2, 16
    w = torch.randn(32, ng * (r + 2) * d, device=DEV)
    f = _freqs(s, d)

    def fn(x):
        mixed = (x @ w).view(s, b, ng, (r + 2) * d)
        q, k, v = qkv_rope(mixed, f, f, r)
        return (q.float().sum() + k.float().pow(2).sum() + v.float().sum())

    assert_compiles_like_eager(fn, torch.randn(s, b, 32, device=DEV, requires_grad=True))


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="r=3"):
        qkv_rope(torch.randn(2, 1, 1, 21), _freqs(2, 4), _freqs(2, 4), 3)
    with pytest.raises(ValueError, match="q_freqs must be float32"):
        qkv_rope(torch.randn(2, 1, 1, 24), _freqs(3, 8), _freqs(2, 8), 1)
