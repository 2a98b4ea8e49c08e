"""The fused fp8 SwiGLU MLP (primus/turbo/fp8_mlp.py): the SwiGLU kernels' amax outputs, the casts that use them,
and the op pair vs the unfused fp8 linears + SwiGLU (bit for bit) and vs float64 (the fp8 band).

Band: each fp8 GEMM lands at ~4-6% of float64 (test_turbo_fp8's docstring); fc2 multiplies an operand that already
carries fc1's error, so the MLP's output and gradients sit near sqrt(2) times that: 0.1 (e4m3), 0.2 (e5m2 gradients,
"hybrid"). A wrong scale, transpose or an amax missing a program's part is of order 1 (or saturates), far outside.
"""
import pytest
import torch
import torch._dynamo

from turbo_util import DEV, backward_ops, fills, relerr  # noqa: I001
from primus.turbo import fp8_linear as F8
from primus.turbo import swiglu as S
from primus.turbo.fp8_mlp import fp8_swiglu_mlp, fp8_swiglu_mlp_bwd, fp8_swiglu_mlp_fwd

E4 = torch.float8_e4m3fn
SHAPES = [(37, 64, 48), (130, 32, 80), (16, 48, 1040)]  # (tokens, hidden, ffn): off every block, F past a chunk


@pytest.mark.parametrize("T,F", [(13, 40), (37, 1100), (5, 2500)])
def test_swiglu_amax_outputs_are_the_max_of_what_the_kernels_wrote(T, F):
    """The forward (every config of its tuned space) and the backward keep max |output| of the rounded values in
    their slots: exactly the amax the cast's own pass reads off the stored tensor; the outputs are the plain
    kernels' bytes. A large element placed late in the tensor (a late program) must be in the max."""
    h = torch.randn(T, 2 * F, device=DEV, dtype=torch.bfloat16)
    h[T - 1, F - 1] = 9.0  # the gate of the last row's last output
    h[T - 1, 2 * F - 1] = -7.0
    dy = torch.randn(T, F, device=DEV, dtype=torch.bfloat16)
    plain = S._fwd(h, None)
    for cfg in S._FWD.space((h, None, None, None, T * F, F, h.stride(0)), HAS_P=False, WANT_AMAX=True,
                            NS=S.AMAX_SLOTS):
        slots = S.amax_slots(DEV)
        y = S._fwd(h, None, config=cfg, amax=slots)
        assert torch.equal(y, plain), cfg
        assert slots.max().item() == y.float().abs().max().item(), cfg
    y, slots = S.swiglu_fwd_amax(h)
    assert slots.numel() == S.AMAX_SLOTS and slots.max().item() == y.float().abs().max().item()
    dh, dslots = S.swiglu_bwd_amax(dy, h)
    assert torch.equal(dh, S._bwd(dy, h, None)[0])
    assert dslots.max().item() == dh.float().abs().max().item() > 0


@pytest.mark.parametrize("outs", [(True, True), (True, False), (False, True)])
def test_cast_with_the_producers_amax_gives_the_bytes_of_the_two_pass_cast(outs):
    wy, wt = outs
    h = torch.randn(70, 2 * 50, device=DEV, dtype=torch.bfloat16) * 3
    y, slots = S.swiglu_fwd_amax(h)
    want = F8.cast_tensorwise(y, E4, want_y=wy, want_t=wt)
    got = F8.cast_tensorwise(y, E4, want_y=wy, want_t=wt, amax=slots)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a.view(torch.uint8) if a.dtype == E4 else a, b.view(torch.uint8) if b.dtype == E4
                               else b)


def test_cast_refuses_an_amax_it_cannot_use():
    x = torch.randn(20, 32, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="partial maxima"):
        F8.cast_tensorwise(x, E4, amax=torch.zeros(F8._PARTS + 1, device=DEV))
    with pytest.raises(ValueError, match="tensorwise recipe's"):
        F8.fp8_forward(x, torch.randn(16, 32, device=DEV, dtype=torch.bfloat16), None, "rowwise",
                       x_amax=torch.zeros(4, device=DEV))


def _params(T, H, F, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(DEV, torch.bfloat16)
    w1 = (torch.randn(2 * F, H, generator=g) / H ** 0.5).to(DEV, torch.bfloat16)
    w2 = (torch.randn(H, F, generator=g) / F ** 0.5).to(DEV, torch.bfloat16)
    dout = torch.randn(T, H, generator=g).to(DEV, torch.bfloat16)
    return x, w1, w2, dout


def _run(fn, x, w1, w2, dout):
    x, w1, w2 = (t.clone().requires_grad_() for t in (x, w1, w2))
    out = fn(x, w1, w2)
    out.backward(dout)
    return out.detach(), x.grad, w1.grad, w2.grad


def _unfused(fmt):
    return lambda x, w1, w2: F8.fp8_linear(S.swiglu(F8.fp8_linear(x, w1, None, "tensorwise", fmt)), w2, None,
                                           "tensorwise", fmt)


@pytest.mark.parametrize("T,H,F", SHAPES)
@pytest.mark.parametrize("fmt", ["e4m3", "hybrid"])
def test_fused_mlp_is_the_unfused_fp8_mlp_bit_for_bit_and_within_the_fp8_band(T, H, F, fmt):
    x, w1, w2, dout = _params(T, H, F)
    got = _run(lambda a, b, c: fp8_swiglu_mlp(a, b, c, fmt), x, w1, w2, dout)
    want = _run(_unfused(fmt), x, w1, w2, dout)
    for name, a, b in zip(("out", "dx", "dw1", "dw2"), got, want):
        assert torch.equal(a, b), name
    ref = _run(lambda a, b, c: S.swiglu_reference(a @ b.t()) @ c.t(), *(t.double() for t in (x, w1, w2, dout)))
    band = {"e4m3": 0.1, "hybrid": 0.2}[fmt]
    assert relerr(got[0], ref[0]) < 0.1
    for name, a, b in zip(("dx", "dw1", "dw2"), got[1:], ref[1:]):
        assert relerr(a, b) < band, name


def test_fused_mlp_takes_leading_dims_and_refuses_mismatched_weights():
    x, w1, w2, dout = _params(24, 32, 48)
    out = fp8_swiglu_mlp(x.view(4, 6, 32), w1, w2)
    assert out.shape == (4, 6, 32) and torch.equal(out.view(24, 32), fp8_swiglu_mlp(x, w1, w2))
    with pytest.raises(ValueError, match="w1 must be"):
        fp8_swiglu_mlp(x, w1[:-2], w2)


def test_fused_mlp_reuses_cached_weight_casts(weight_casts):
    """Under the fp8 weight cache (two micro batches of one step) each weight is cast once, and the results equal
    the uncached run's bit for bit."""
    x, w1, w2, dout = _params(37, 64, 48)
    weight_casts.enabled = False
    want = [_run(fp8_swiglu_mlp, x * (1 + i), w1, w2, dout) for i in range(2)]
    assert (weight_casts.misses, weight_casts.hits) == (0, 0)
    weight_casts.enabled = True
    w1c, w2c = w1.clone().requires_grad_(), w2.clone().requires_grad_()
    for i in range(2):
        xi = (x * (1 + i)).requires_grad_()
        out = fp8_swiglu_mlp(xi, w1c, w2c)
        out.backward(dout)
        assert torch.equal(out, want[i][0]) and torch.equal(xi.grad, want[i][1])
        assert torch.equal(w1c.grad, want[i][2]) and torch.equal(w2c.grad, want[i][3])
        w1c.grad = w2c.grad = None
    assert (weight_casts.misses, weight_casts.hits) == (2, 2)


def test_fused_mlp_ops_fakes_match_and_compile_without_graph_breaks():
    """opcheck's fake-tensor test for both ops (inductor asserts the declared shapes / strides), and the op pair
    under torch.compile(fullgraph=True) gives the eager results."""
    x, w1, w2, dout = _params(40, 32, 48)
    checks = ("test_faketensor",)
    assert torch.library.opcheck(fp8_swiglu_mlp_fwd, (x, w1, w2, "e4m3"), test_utils=checks) == \
        {"test_faketensor": "SUCCESS"}
    out, *saved = fp8_swiglu_mlp_fwd(x, w1, w2, "e4m3")
    assert torch.library.opcheck(fp8_swiglu_mlp_bwd, (dout, *saved, "e4m3", torch.bfloat16),
                                 test_utils=checks) == {"test_faketensor": "SUCCESS"}
    torch._dynamo.reset()
    compiled = torch.compile(fp8_swiglu_mlp, fullgraph=True, backend="aot_eager")
    got, want = _run(compiled, x, w1, w2, dout), _run(fp8_swiglu_mlp, x, w1, w2, dout)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.parametrize("op", ["mlp", "linear"])
def test_backward_fills_no_zero_gradients_for_the_saved_outputs(op):
    """The ops return their saved fp8 tensors as outputs (custom ops cannot stash them otherwise). torch fills a
    zero "gradient" for each such output before calling the backward, unless the op says not to: on the H200 the
    fills made the fused MLP 1% slower than the unfused one (2026-12-02). The backward
    must dispatch no zeros / fill."""
    from primus.turbo import fp8_ops

    x, w1, w2, _ = _params(32, 32, 48)
    x.requires_grad_()
    out = fp8_swiglu_mlp(x, w1, w2) if op == "mlp" else fp8_ops.fp8_linear_traced(x, w1, None, "tensorwise", "e4m3")
    ops = backward_ops(out.float().sum())
    assert any("bwd" in o for o in ops) and not fills(ops), ops
