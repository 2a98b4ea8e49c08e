"""Fused MoE kernels (Triton, interpreter on CPU) vs float64 PyTorch references, fwd + bwd."""
import pytest
import torch

from turbo_util import BAND, DEV, relerr  # noqa: I001
from primus.turbo import moe_ops as M


@pytest.mark.parametrize("T,E,k", [(37, 8, 2), (10, 20, 3), (5, 6, 1)])
@pytest.mark.parametrize("score,pre", [("softmax", False), ("softmax", True), ("sigmoid", False)])
def test_router(T, E, k, score, pre):
    logits = torch.randn(T, E, device=DEV, dtype=torch.float32, requires_grad=True)
    bias = torch.randn(E, device=DEV) * 0.1 if score == "sigmoid" else None
    p, rmap, aux = M.fused_router(logits, k, score, pre, scaling_factor=1.5, expert_bias=bias)
    ld = logits.detach().double().requires_grad_()
    pr, rr, ar = M.router_reference(ld, k, score, pre, 1.5, bias)
    assert torch.equal(rmap.cpu(), rr.cpu())
    assert (rmap.sum(1) == k).all()
    assert relerr(p, pr) < 1e-5 and relerr(aux, ar) < 1e-5
    gp, ga = torch.randn(T, E, device=DEV), torch.randn(T, E, device=DEV)
    (p * gp).sum().add((aux * ga).sum()).backward()
    (pr * gp.double()).sum().add((ar * ga.double()).sum()).backward()
    assert relerr(logits.grad, ld.grad) < 1e-5


@pytest.mark.parametrize("score,pre", [("softmax", False), ("softmax", True), ("sigmoid", False)])
def test_router_every_tuned_tile_height(monkeypatch, score, pre):
    """On a GPU the router kernels autotune the tokens per program (BT) and warps; the interpreter runs
    _router_blocks' choice, so each BT of the space is forced through it here (fwd + bwd vs float64)."""
    BE = 64
    bts = sorted({c["BT"] for c in M._ROUTER_FWD.space(BE=BE)})
    assert bts == [4, 8, 16, 32, 64]
    assert M._ROUTER_BWD.space(BE=BE) == M._ROUTER_FWD.space(BE=BE)
    T, E, k = 37, 64, 8
    bias = torch.randn(E, device=DEV) * 0.1 if score == "sigmoid" else None
    for bt in bts:
        monkeypatch.setattr(M, "_router_blocks", lambda E, bt=bt: (bt, BE))
        logits = torch.randn(T, E, device=DEV, dtype=torch.float32, requires_grad=True)
        p, rmap, aux = M.fused_router(logits, k, score, pre, scaling_factor=1.5, expert_bias=bias)
        ld = logits.detach().double().requires_grad_()
        pr, rr, ar = M.router_reference(ld, k, score, pre, 1.5, bias)
        assert torch.equal(rmap.cpu(), rr.cpu()), bt
        gp, ga = torch.randn(T, E, device=DEV), torch.randn(T, E, device=DEV)
        (p * gp).sum().add((aux * ga).sum()).backward()
        (pr * gp.double()).sum().add((ar * ga.double()).sum()).backward()
        assert relerr(p, pr) < 1e-5 and relerr(aux, ar) < 1e-5 and relerr(logits.grad, ld.grad) < 1e-5, bt


@pytest.mark.parametrize("T,F", [(13, 40), (3, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_with_probs(T, F, dtype):
    h = torch.randn(T, 2 * F, device=DEV).to(dtype).requires_grad_()
    p = torch.rand(T, 1, device=DEV, requires_grad=True)
    y = M.swiglu_with_probs(h, p)
    dy = torch.randn(T, F, device=DEV).to(dtype)
    y.backward(dy)
    hd, pd = h.detach().double().requires_grad_(), p.detach().double().requires_grad_()
    yr = M.swiglu_with_probs_reference(hd, pd)
    yr.backward(dy.double())
    tol = BAND[dtype]
    assert relerr(y, yr) < tol and relerr(h.grad, hd.grad) < tol and relerr(p.grad, pd.grad) < tol


@pytest.mark.parametrize("T,E,k,H", [(11, 4, 2, 24), (7, 9, 3, 130), (5, 8, 2, 1100), (6, 256, 8, 40)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_permute_unpermute(T, E, k, H, dtype):
    logits = torch.randn(T, E, device=DEV)
    probs, rmap, _ = M.fused_router(logits, k)
    x = torch.randn(T, H, device=DEV).to(dtype).requires_grad_()
    pr = probs.detach().clone().requires_grad_()
    y, py, row_map = M.permute(x, rmap, pr, num_out_tokens=T * k)
    # "experts": a per-row scale, then combine with the probs
    scale = torch.randn(T * k, 1, device=DEV).to(dtype)
    out = M.unpermute(y * scale, row_map, pr)
    dout = torch.randn(T, H, device=DEV).to(dtype)
    (out * dout).sum().add((py * torch.arange(T * k, device=DEV)).sum()).backward()

    xd, pd = x.detach().double().requires_grad_(), pr.detach().double().requires_grad_()
    yr, pyr, idx = M.permute_reference(xd, rmap, pd)
    outr = M.unpermute_reference(yr * scale.double(), idx, T, pd)
    (outr * dout.double()).sum().add((pyr * torch.arange(T * k, device=DEV)).sum()).backward()
    assert torch.equal(y.detach().double(), yr.detach()) and torch.equal(py.detach().double(), pyr.detach())
    assert torch.equal(M.make_row_id_map(rmap).ne(-1).sum(0).cpu(), rmap.sum(1).cpu())
    tol = BAND[dtype]
    assert relerr(out, outr) < tol and relerr(x.grad, xd.grad) < tol and relerr(pr.grad, pd.grad) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_permute_unpermute_tokens_with_more_routes_than_the_average(dtype):
    """The kernels size their route slots by rows / tokens (top-k when dropless); a token with more routes than that
    (uneven routing) takes the extra slot groups: token 0 has 7 routes where the slots hold 2, token 3 none."""
    T, E, H = 6, 9, 40
    rmap = torch.zeros(T, E, dtype=torch.bool, device=DEV)
    rmap[0, :7] = True
    rmap[1, 2] = rmap[2, 8] = rmap[4, 0] = rmap[5, 3] = rmap[5, 4] = True
    n = int(rmap.sum())
    assert M._blocks(E, H, n, T)[1] == 2  # 12 rows over 6 tokens: 2 slots a group
    probs = torch.where(rmap, torch.rand(T, E, device=DEV), torch.zeros((), device=DEV)).requires_grad_()
    x = torch.randn(T, H, device=DEV).to(dtype).requires_grad_()
    y, py, row_map = M.permute(x, rmap, probs, num_out_tokens=n)
    scale = torch.randn(n, 1, device=DEV).to(dtype)
    out = M.unpermute(y * scale, row_map, probs)
    dout = torch.randn(T, H, device=DEV).to(dtype)
    (out * dout).sum().add((py * torch.arange(n, device=DEV)).sum()).backward()

    xd, pd = x.detach().double().requires_grad_(), probs.detach().double().requires_grad_()
    yr, pyr, idx = M.permute_reference(xd, rmap, pd)
    outr = M.unpermute_reference(yr * scale.double(), idx, T, pd)
    (outr * dout.double()).sum().add((pyr * torch.arange(n, device=DEV)).sum()).backward()
    assert torch.equal(y.detach().double(), yr.detach()) and torch.equal(py.detach().double(), pyr.detach())
    assert torch.equal(out[3].float(), torch.zeros(H, device=DEV))  # no route: zeros
    tol = BAND[dtype]
    assert relerr(out, outr) < tol and relerr(x.grad, xd.grad) < tol and relerr(probs.grad, pd.grad) < tol


def test_permute_tiles_grow_with_top_k_not_with_the_experts():
    """[route slots x columns] tiles: DeepSeek-V2-Lite's 64 experts top-6 and Qwen3-30B-A3B's 128 top-8 both take 8
    slots of 1024 columns (the [experts x columns] tiles before: 128 and 64 columns, most lanes masked off)."""
    assert M._blocks(64, 2048, 8192 * 6, 8192) == (64, 8, M._bh(2048))
    assert M._blocks(128, 2048, 8192 * 8, 8192) == (128, 8, M._bh(2048))
    assert M._blocks(8, 4096, 4096 * 2, 4096) == (8, 2, M._bh(4096))


def _moe_ops_chain(logits, x, k):
    """router -> permute (with probs) -> a per-expert scale on its rows -> unpermute weighted by the probs; the aux
    scores used; the routing map summed per expert on the device (the sync-free dispatcher's group sizes)."""
    probs, rmap, aux = M.fused_router(logits, k)
    y, py, row_map = M.permute(x, rmap, probs, num_out_tokens=x.shape[0] * k)
    counts = rmap.sum(0)
    scale = torch.repeat_interleave(torch.arange(1, rmap.shape[1] + 1, device=x.device, dtype=y.dtype), counts,
                                    output_size=y.shape[0])
    out = M.unpermute(y * (py.to(y.dtype) * scale)[:, None], row_map, probs)
    return out, aux


def test_router_permute_unpermute_are_custom_ops_that_pass_opcheck():
    """Schema, fake kernels (shapes, dtypes) and autograd registration of every op, as torch.compile relies on."""
    T, E, k, H = 9, 6, 2, 40
    logits = torch.randn(T, E, device=DEV, requires_grad=True)
    x = torch.randn(T, H, device=DEV, requires_grad=True)
    p, rmap, aux = M._router_op(logits, k, False, False, 1.0, None)
    bias = torch.randn(E, device=DEV)
    row_map = M.make_row_id_map(rmap)
    probs = p.detach().requires_grad_()
    y = torch.randn(T * k, H, device=DEV, requires_grad=True)
    cases = [(M._router_op, (logits, k, False, False, 1.0, None)), (M._router_op, (logits, k, True, False, 2.0, bias)),
             (M._router_bwd_op, (logits.detach(), rmap, torch.randn(T, E, device=DEV), None, k, False, False, 1.0)),
             (M._permute_op, (x, row_map, T * k, probs)), (M._permute_op, (x, row_map, T * k, None)),
             (M._unpermute_op, (y, row_map, T, probs)), (M._unpermute_op, (y, row_map, T, None)),
             (M._unpermute_bwd_op, (torch.randn(T, H, device=DEV), y.detach(), row_map, probs.detach()))]
    for op, args in cases:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_router_permute_unpermute_compile_as_one_graph(backend):
    """fullgraph=True (a graph break raises): the chain compiles with no break and gives eager's outputs and
    gradients (aot_eager: bit for bit, the same kernels and torch ops; inductor: its own code around the same kernels,
    which must also build - a bool routing map it had to bit-cast from int8 did not on a CPU)."""
    import torch._dynamo

    T, E, k, H = 12, 8, 2, 48
    g = torch.Generator().manual_seed(0)  # not the worker's global stream: the same inputs in any test order
    logits0, x0 = torch.randn(T, E, generator=g).to(DEV), torch.randn(T, H, generator=g).to(DEV)

    def run(fn):
        logits, x = logits0.clone().requires_grad_(), x0.clone().requires_grad_()
        out, aux = fn(logits, x, k)
        (out.square().sum() + aux.square().sum()).backward()
        return out.detach(), aux.detach(), logits.grad, x.grad

    eager = run(_moe_ops_chain)
    torch._dynamo.reset()
    try:
        compiled = run(torch.compile(_moe_ops_chain, backend=backend, fullgraph=True))
    finally:
        torch._dynamo.reset()
    for a, b in zip(compiled, eager):
        if backend == "aot_eager":
            assert torch.equal(a, b)
        else:
            # inductor reorders fp32 sums (the probs' gradient over the hidden size, the softmax backward over the
            # experts) that cancel to elements far smaller than their terms, so the rounding is set by the largest
            # element, not each: 16 fp32 unit roundoffs (2^-24) of it allowed (over 40 seeds the worst was 3.1:
            # 2.4e-4 on 1,289)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=2.0 ** -20 * b.abs().max().item())
