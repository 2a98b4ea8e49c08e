"""Cross entropy (primus/turbo/cross_entropy.py) vs float64 F.cross_entropy, forward and backward; in-place gradient;
a single node under torch.compile."""
import pytest
import torch
import torch.nn.functional as F

from turbo_util import BAND, DEV, backward_ops, fills, relerr  # noqa: I001
from primus.turbo import cross_entropy as ce_mod
from primus.turbo.cross_entropy import cross_entropy


def reference(x, labels, g, ignore_index=-100):
    xd = x.detach().double().requires_grad_()
    ref = F.cross_entropy(xd, labels, ignore_index=ignore_index, reduction="none")
    (ref * g.double()).sum().backward()
    return ref.detach(), xd.grad


def inputs(N, V, dtype, ignore=True, scale=3.0):
    x = (torch.randn(N, V, device=DEV) * scale).to(dtype).requires_grad_()
    labels = torch.randint(0, V, (N,), device=DEV)
    if ignore and N > 2:
        labels[torch.randperm(N, device=DEV)[: N // 3]] = -100
    return x, labels, torch.randn(N, device=DEV)


@pytest.mark.parametrize("N,V", [(1, 1000), (3, 4097), (37, 1000), (5, 20000)])  # V past the 8192 / 4096 blocks
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_matches_float64(N, V, dtype):
    x, labels, g = inputs(N, V, dtype)
    loss = cross_entropy(x, labels)
    (loss * g).sum().backward()
    ref, dref = reference(x, labels, g)
    assert loss.shape == (N,) and loss.dtype == torch.float32 and x.grad.dtype == dtype
    assert relerr(loss, ref) < BAND[dtype] and relerr(x.grad, dref) < BAND[dtype]
    ignored = labels == -100
    assert (loss[ignored] == 0).all() and (x.grad[ignored] == 0).all()


@pytest.mark.parametrize("V", [1000, 777])
def test_many_chunks_and_a_partial_last_one(V, monkeypatch):
    """Small blocks: the online max / sum-exp runs over several chunks (the last one partial) in both kernels."""
    monkeypatch.setattr(ce_mod, "FWD_BLOCK", 128)
    monkeypatch.setattr(ce_mod, "BWD_BLOCK", 256)
    x, labels, g = inputs(7, V, torch.bfloat16, scale=8.0)
    loss = cross_entropy(x, labels)
    (loss * g).sum().backward()
    ref, dref = reference(x, labels, g)
    assert relerr(loss, ref) < BAND[torch.bfloat16] and relerr(x.grad, dref) < BAND[torch.bfloat16]


def test_strided_rows_other_ignore_index_and_a_broadcast_gradient():
    """Rows of a wider tensor (row stride > V), a transposed (copied) input, ignore_index=0, loss.sum() (the
    gradient of each row arrives with stride 0)."""
    wide = torch.randn(6, 1030, device=DEV)
    x = wide[:, :1000].requires_grad_()
    labels = torch.tensor([0, 5, 0, 999, 17, 3], device=DEV)
    loss = cross_entropy(x, labels, ignore_index=0)
    loss.sum().backward()
    ref, dref = reference(x, labels, torch.ones(6, device=DEV), ignore_index=0)
    assert relerr(loss, ref) < BAND[torch.float32] and relerr(x.grad, dref) < BAND[torch.float32]
    xt = torch.randn(300, 4, device=DEV).t()  # stride(1) != 1
    lt = labels[:4] % 300
    torch.testing.assert_close(cross_entropy(xt, lt).double(), F.cross_entropy(xt.double(), lt, reduction="none"),
                               rtol=1e-5, atol=1e-5)


def test_label_out_of_range_is_nan_not_a_silent_value():
    loss = cross_entropy(torch.randn(3, 50, device=DEV), torch.tensor([1, 50, -1], device=DEV))
    assert torch.isfinite(loss[0]) and torch.isnan(loss[1:]).all()


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match=r"\(N, V\)"):
        cross_entropy(torch.randn(2, 3, 4, device=DEV), torch.zeros(2, dtype=torch.long, device=DEV))
    with pytest.raises(ValueError, match="labels"):
        cross_entropy(torch.randn(2, 4, device=DEV), torch.zeros(3, dtype=torch.long, device=DEV))


def test_inplace_backward_writes_the_gradient_into_the_logits():
    """inplace_backward: same gradient, held in the logits' own storage (no (N, V) buffer allocated)."""
    x, labels, g = inputs(9, 3000, torch.bfloat16)
    h = x * 1.0  # a non-leaf, as megatron's output layer's logits are
    loss = cross_entropy(h, labels, inplace_backward=True)
    (loss * g).sum().backward()
    ref, dref = reference(x, labels, g)
    assert relerr(loss, ref) < BAND[torch.bfloat16] and relerr(x.grad, dref) < BAND[torch.bfloat16]
    torch.testing.assert_close(h.detach(), x.grad)  # h now holds the gradient
    leaf = x.detach().clone().requires_grad_()  # a leaf is the caller's data: out of place
    cross_entropy(leaf, labels, inplace_backward=True).sum().backward()
    torch.testing.assert_close(leaf.detach(), x.detach())
    assert leaf.grad.data_ptr() != leaf.data_ptr()


def test_inplace_backward_fails_loudly_when_someone_else_still_needs_the_logits():
    """An op that saved the logits before the loss did runs its backward after it: the version counter says the
    logits were overwritten (the error any in-place op gives), never a silently wrong gradient."""
    x = torch.randn(4, 100, device=DEV, requires_grad=True)
    labels = torch.randint(0, 100, (4,), device=DEV)
    h = x * 1.0
    other = h.sin().sum()  # saves h, created before the loss: its backward runs after the loss's
    loss = cross_entropy(h, labels, inplace_backward=True).sum()
    with pytest.raises(RuntimeError, match="inplace operation"):
        (loss + other).backward()


def test_compile_keeps_one_node_and_the_same_values():
    """fullgraph=True (a graph break would raise); the op stays one node; under compile inplace_backward falls back
    to the out-of-place gradient (the logits are left as they were)."""
    import torch._dynamo

    torch._dynamo.reset()
    w = torch.randn(16, 500, device=DEV)

    def fn(a, labels):
        h = a @ w
        return cross_entropy(h, labels, inplace_backward=True).mean()

    a = torch.randn(12, 16, device=DEV, requires_grad=True)
    labels = torch.randint(0, 500, (12,), device=DEV)
    labels[3] = -100
    explain = torch._dynamo.explain(fn)(a, labels)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    nodes = [n for gm in explain.graphs for n in gm.graph.nodes if "cross_entropy" in str(n.target)]
    assert len(nodes) == 1, nodes
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(a, labels)
    out.backward()
    a2 = a.detach().clone().requires_grad_()
    ref = F.cross_entropy((a2 @ w).double(), labels, reduction="none").mean()
    ref.backward()
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.grad, a2.grad, rtol=1e-4, atol=1e-5)


def test_backward_fills_no_zero_gradient_for_the_log_sum_exp():
    x, labels, _ = inputs(16, 300, torch.bfloat16)
    x = x.clone().requires_grad_()
    ops = backward_ops(cross_entropy(x, labels, inplace_backward=False).sum())
    assert any("cross_entropy_bwd" in o for o in ops) and not fills(ops), ops
