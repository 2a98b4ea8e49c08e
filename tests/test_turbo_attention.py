"""turbo_attention (SDPA, GQA without repeating K/V) vs a float64 reference, fwd + bwd, every layout."""
import pytest
import torch

from turbo_util import BAND, DEV, relerr  # noqa: I001
from primus.turbo.attention import attention_reference, turbo_attention


def _shape(layout, b, s, h, d):
    return {"bshd": (b, s, h, d), "sbhd": (s, b, h, d), "bhsd": (b, h, s, d)}[layout]


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
@pytest.mark.parametrize("hq,hk,s,d", [(4, 4, 37, 16), (6, 2, 50, 32), (4, 1, 17, 8)])
@pytest.mark.parametrize("causal", [True, False])
def test_attention(layout, hq, hk, s, d, causal):
    # bf16 on the GPU (the fused SDPA kernels have no fp32 GQA path); fp32 on CPU (math backend)
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    q = torch.randn(_shape(layout, 2, s, hq, d), device=DEV, dtype=dtype, requires_grad=True)
    k = torch.randn(_shape(layout, 2, s, hk, d), device=DEV, dtype=dtype, requires_grad=True)
    v = torch.randn(_shape(layout, 2, s, hk, d), device=DEV, dtype=dtype, requires_grad=True)
    do = torch.randn(_shape(layout, 2, s, hq, d), device=DEV, dtype=dtype)
    o = turbo_attention(q, k, v, causal=causal, layout=layout)
    o.backward(do)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    orf = attention_reference(qd, kd, vd, causal=causal, layout=layout)
    orf.backward(do.double())
    assert o.shape == q.shape
    tol = BAND[dtype]
    for a, b in ((o, orf), (q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert relerr(a, b) < tol


def test_bad_heads():
    q = torch.randn(1, 8, 6, 4)
    k = torch.randn(1, 8, 4, 4)
    with pytest.raises(ValueError):
        turbo_attention(q, k, k)
