"""SwiGLU (primus/turbo/swiglu.py) vs float64, forward and backward; a single node under torch.compile."""
import pytest
import torch

from turbo_util import BAND, DEV, assert_compiles_like_eager, relerr  # noqa: I001
from primus.turbo.swiglu import swiglu, swiglu_reference, swiglu_with_probs


@pytest.mark.parametrize("shape", [(13, 2 * 40), (3, 2, 2 * 300), (5, 2 * 1100)])  # F past one 1024-wide block
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_matches_float64(shape, dtype):
    h = torch.randn(shape, device=DEV).to(dtype).requires_grad_()
    y = swiglu(h)
    dy = torch.randn(y.shape, device=DEV).to(dtype)
    y.backward(dy)
    hd = h.detach().double().requires_grad_()
    yr = swiglu_reference(hd)
    yr.backward(dy.double())
    assert y.shape == (*shape[:-1], shape[-1] // 2)
    assert relerr(y, yr) < BAND[dtype] and relerr(h.grad, hd.grad) < BAND[dtype]


def test_custom_ops_compile_without_graph_breaks():
    w = torch.randn(16, 64, device=DEV)

    def fn(x, p):
        h = x @ w
        return swiglu(h).sum() + swiglu_with_probs(h, p).pow(2).sum()

    x = torch.randn(6, 16, device=DEV, requires_grad=True)
    p = torch.rand(6, device=DEV, requires_grad=True)
    assert_compiles_like_eager(fn, x, p)


def test_odd_width_is_a_clear_error():
    with pytest.raises(ValueError, match="must be even"):
        swiglu(torch.randn(2, 7, device=DEV))


@pytest.mark.parametrize("T,F", [(13, 40), (37, 1100), (5, 2500)])
@pytest.mark.parametrize("with_probs", [False, True])
def test_every_config_of_the_tuned_forward_is_correct(T, F, with_probs):
    """On a GPU the forward autotunes over _FWD's space (elements per program, warps); the interpreter cannot
    benchmark, so every config runs here against float64, at sizes that are no multiple of a block and with rows
    that straddle blocks (outputs poisoned); a strided h (rows further apart than 2F) too."""
    from primus.turbo import swiglu as S

    wide = torch.randn(T, 2 * F + 6, device=DEV, dtype=torch.bfloat16)
    p = torch.rand(T, device=DEV) if with_probs else None
    space = S._FWD.space((wide, p, None, None, T * F, F, wide.stride(0)), HAS_P=with_probs, WANT_AMAX=False,
                          NS=S.AMAX_SLOTS)
    assert len(space) >= 3
    for h in (wide[:, :2 * F].contiguous(), wide[:, :2 * F]):
        ref = swiglu_reference(h.double()) * (p.double()[:, None] if with_probs else 1)
        for cfg in space:
            y = S._fwd(h, p, config=cfg)
            assert relerr(y, ref) < BAND[torch.bfloat16], cfg
