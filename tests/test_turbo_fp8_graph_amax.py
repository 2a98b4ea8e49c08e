"""The tensorwise fp8 casts' amaxes from the compiled graph (primus.turbo.fp8_ops.graph_amax, precision.fp8_graph_amax).

Under torch.compile the fp8 linear's custom ops and the fused fp8 MLP take the amax of x (forward) and of the output
gradient (backward) as torch ops of the graph, which inductor can fuse into the kernel that produced the tensor;
their casts then skip the amax pass. Checked here: which tensors still get an amax pass (only the weights, whose
casts are not in the graph), that the results equal the eager ops' (the amax is a max: exact, so bit for bit
through aot_eager), and, through inductor, a norm -> fp8 linear block within the fp8 band of its eager run.
"""
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from turbo_util import DEV, relerr  # noqa: I001
from primus.turbo import fp8_linear as F8
from primus.turbo import fp8_ops
from primus.turbo.fp8_mlp import fp8_swiglu_mlp


@pytest.fixture
def amax_passes(monkeypatch):
    """The shapes fp8_linear's amax pass ran over, in call order; GRAPH_AMAX restored after the test."""
    calls = []
    orig = F8._amax_partials

    def counting(flat, delayed=None):
        calls.append(tuple(flat.shape))
        return orig(flat, delayed)

    monkeypatch.setattr(F8, "_amax_partials", counting)
    saved = dict(fp8_ops.GRAPH_AMAX)
    yield calls
    fp8_ops.GRAPH_AMAX.update(saved)
    torch._dynamo.reset()


def _tensors(shapes, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [(torch.randn(*s, generator=g) / (s[-1] ** 0.5 if i else 1)).to(DEV, torch.bfloat16)
            for i, s in enumerate(shapes)]


def _run(fn, inputs, dout):
    leaves = [t.clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(dout)
    return [out.detach()] + [t.grad for t in leaves]


CASES = {
    # name: (fn, input shapes (x first, then weights), output shape)
    "linear": (lambda x, w: fp8_ops.fp8_linear_traced(x, w, None, "tensorwise", "hybrid"), [(200, 64), (96, 64)],
               (200, 96)),
    "mlp": (lambda x, w1, w2: fp8_swiglu_mlp(x, w1, w2, "hybrid"), [(72, 32), (96, 32), (32, 48)], (72, 32)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_fp8_ops_take_x_and_dy_amaxes_from_the_graph(amax_passes, case):
    """Eagerly every cast but the SwiGLU's outputs runs its amax pass (x, the weights, dy); compiled with the graph
    amax on only the weights do, and the outputs and gradients are the eager ones bit for bit; off, the compiled
    run takes every amax pass as eager does."""
    fn, shapes, out_shape = CASES[case]
    inputs = _tensors(shapes, seed=len(shapes))
    dout = _tensors([out_shape], seed=7)[0]
    want = _run(fn, inputs, dout)
    eager = list(amax_passes)
    assert sorted(eager) == sorted(shapes + [out_shape])  # x, weights, dy
    for on in (True, False):
        fp8_ops.GRAPH_AMAX["enabled"] = on
        torch._dynamo.reset()
        amax_passes.clear()
        got = _run(torch.compile(fn, fullgraph=True, backend="aot_eager"), inputs, dout)
        assert sorted(amax_passes) == (sorted(shapes[1:]) if on else sorted(eager)), on
        for name, a, b in zip(("out", "dx", "dw", "dw2"), got, want):
            assert torch.equal(a, b), (on, name)


@pytest.mark.parametrize("shape", [(1, 1), (37, 300), (130, 4099)])
def test_graph_amax_is_the_amax_pass_maximum(shape):
    x = _tensors([shape], seed=shape[1])[0]
    x.view(-1)[x.numel() // 3] = -1000.0  # the largest magnitude is negative
    got = fp8_ops.graph_amax(x)
    part, n = F8._amax_partials(x.reshape(-1))
    assert got.shape == (1,) and got.dtype == torch.float32
    assert got.item() == part[:n].max().item() == 1000.0


def test_graph_amax_only_for_the_tensorwise_recipe_inside_a_compiled_graph():
    assert not fp8_ops.in_graph_amax("tensorwise")  # eager: the cast's own amax pass is the cheaper one
    seen = {}

    def probe(x):
        seen.update({r: fp8_ops.in_graph_amax(r) for r in ("tensorwise", "rowwise", "blockwise", "delayed")})
        return x + 1

    torch._dynamo.reset()
    torch.compile(probe, backend="eager")(torch.ones(3))
    assert seen == {"tensorwise": True, "rowwise": False, "blockwise": False, "delayed": False}


def test_inductor_norm_then_fp8_linear_within_the_band_of_eager(amax_passes):
    """Through inductor (C++ on CPU, Triton on a GPU) the norm's output amax may be taken from its unrounded fp32
    values (inductor keeps fused intermediates in fp32), so the scales may differ from eager's by a bf16 rounding:
    equal within the fp8 band, and the x / dy amax passes gone."""
    H, N, T = 64, 96, 160
    x, w, g = _tensors([(T, H), (N, H), (H,)], seed=3)
    g = 1 + 0.1 * g
    dout = _tensors([(T, N)], seed=4)[0]

    def block(x, w, g):
        h = F.rms_norm(x, (H,), g, 1e-5)
        return fp8_ops.fp8_linear_traced(h, w, None, "tensorwise", "hybrid")

    want = _run(block, [x, w, g], dout)
    fp8_ops.GRAPH_AMAX["enabled"] = True
    torch._dynamo.reset()
    amax_passes.clear()
    got = _run(torch.compile(block, fullgraph=True), [x, w, g], dout)
    assert amax_passes == [(N, H)]  # the weight only
    ref = _run(lambda x, w, g: F.rms_norm(x, (H,), g, 1e-5) @ w.t(), [t.double() for t in (x, w, g)],
               dout.double())
    for name, a, b, r in zip(("out", "dx", "dw", "dg"), got, want, ref):
        assert relerr(a, b) < 0.05, name  # an fp8 rounding flip at most, here and there
        assert relerr(a, r) < 0.15, name  # hybrid: e5m2 gradients
