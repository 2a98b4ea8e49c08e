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


@pytest.mark.parametrize("sizes,K,N", [([5, 0, 17, 3], 32, 48), ([33, 1], 16, 32), ([0, 0, 9], 48, 16)])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("fmt", ["e4m3", "hybrid"])
def test_fp8_grouped_gemm(sizes, K, N, trans_b, fmt):
    """fp8 operands, tensorwise scales (tokens, each expert, the gradient) vs the float64 loop: within the fp8
    bands of tests/test_turbo_fp8.py (0.08 forward, 0.15 gradients with e5m2), far from a wrong scale (~1)."""
    from primus.turbo.fp8_linear import fp8_linear_available
    from primus.turbo.grouped_gemm import fp8_grouped_gemm

    if not fp8_linear_available(DEV):
        pytest.skip("no fp8 on this device")
    torch.manual_seed(0)
    G, M = len(sizes), sum(sizes)
    x = torch.randn(M, K, device=DEV).to(torch.bfloat16).requires_grad_()
    scale = torch.tensor([0.5, 4.0, 1.0, 2.0][:G]).view(G, 1, 1)  # experts of different magnitudes: one scale each
    w = ((torch.randn(G, N, K) if trans_b else torch.randn(G, K, N)) * scale / K ** 0.5).to(DEV, torch.bfloat16)
    w.requires_grad_()
    dy = torch.randn(M, N, device=DEV).to(torch.bfloat16)
    y = fp8_grouped_gemm(x, w, torch.tensor(sizes, device=DEV), trans_b=trans_b, fmt=fmt)
    y.backward(dy)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    yr = grouped_gemm_reference(xd, wd, sizes, trans_b=trans_b)
    yr.backward(dy.double())
    gband = 0.15 if fmt == "hybrid" else 0.08
    assert y.dtype == torch.bfloat16 and w.grad.dtype == torch.bfloat16
    assert relerr(y, yr) < 0.08
    assert relerr(x.grad, xd.grad) < gband
    for g, m in enumerate(sizes):  # per expert: an expert's own scale shows in its own rows / gradient
        if m:
            assert relerr(w.grad[g], wd.grad[g]) < gband
        else:
            assert torch.equal(w.grad[g].float(), torch.zeros_like(w.grad[g].float()))


def test_fp8_grouped_gemm_bad_format():
    from primus.turbo.grouped_gemm import fp8_grouped_gemm

    with pytest.raises(ValueError, match="e4m3 or hybrid"):
        fp8_grouped_gemm(torch.randn(4, 16), torch.randn(1, 16, 16), [4], fmt="mxfp8")


def _wgrad_reference(x, dy, sizes):
    out, s = [], 0
    for m in sizes:
        out.append(x[s:s + m].double().t() @ dy[s:s + m].double())
        s += m
    return torch.stack(out)


@pytest.mark.parametrize("sizes,K,N", [([5, 0, 17, 3], 24, 40), ([0, 0, 9], 16, 8)])
@pytest.mark.parametrize("provider", ["triton", "torch"])
@pytest.mark.parametrize("main_dtype", [torch.float32, torch.bfloat16])
def test_grouped_gemm_accumulate_adds_each_micro_batch_weight_gradient_into_main_grad(sizes, K, N, provider,
                                                                                      main_dtype, monkeypatch):
    """Two micro batches: the output and dx are grouped_gemm's, w gets no gradient, and main_grad (viewed (G, K, N)
    from its parameter's 2-D shape, as megatron's GroupedMLP views weight1) holds its start plus both weight
    gradients, summed in fp32. "torch": torch._grouped_mm GEMMs and, on a CPU, the accumulation's host loop."""
    from primus.turbo import _common
    from primus.turbo.grouped_gemm import grouped_gemm_accumulate

    if provider == "torch" and (not hasattr(torch, "_grouped_mm") or (DEV == "cuda" and (K % 8 or N % 8))):
        pytest.skip("torch._grouped_mm missing or these dims unaligned")
    if provider == "torch" and DEV == "cpu":
        monkeypatch.setattr(_common, "interpreting", lambda: False)  # the accumulation's CPU path, not Triton's
    G = len(sizes)
    param = torch.randn(K, G * N).div(K ** 0.5).to(DEV, torch.bfloat16).requires_grad_()
    main = torch.randn(K, G * N, device=DEV).to(main_dtype)
    start = main.double().clone()
    want = start.view(G, K, N).clone()
    for _ in range(2):
        x = torch.randn(sum(sizes), K, device=DEV).to(torch.bfloat16).requires_grad_()
        w = param.view(G, K, N)
        y = grouped_gemm_accumulate(x, w, torch.tensor(sizes, device=DEV), main, provider=provider)
        dy = torch.randn_like(y)
        y.backward(dy)
        xr = x.detach().double().requires_grad_()
        yr = grouped_gemm_reference(xr, w.detach().double(), sizes)
        yr.backward(dy.double())
        assert relerr(y, yr) < BAND[torch.bfloat16] and relerr(x.grad, xr.grad) < BAND[torch.bfloat16]
        want += _wgrad_reference(x.detach(), dy, sizes)
    assert param.grad is None
    assert relerr(main.view(G, K, N), want) < (1e-4 if main_dtype == torch.float32 else BAND[torch.bfloat16])
    if 0 in sizes:  # an expert with no rows keeps its main_grad as it was
        g = sizes.index(0)
        assert torch.equal(main.view(G, K, N)[g].double(), start.view(G, K, N)[g])


def test_every_tuned_config_of_the_accumulating_wgrad_adds_the_same_sums():
    """On a GPU the accumulating weight-gradient GEMM autotunes its blocks and warps per (K, N); here each config of
    its space runs (Triton's interpreter on a CPU) over uneven experts, one empty, dims no block divides, into fp32
    and bf16 main_grad: start + x^T dy per expert, an empty expert's main_grad unchanged."""
    from primus.turbo import grouped_gemm as GG

    sizes, K, N = [5, 0, 9], 40, 72
    ends = torch.tensor(sizes, device=DEV).cumsum(0).to(torch.int32)
    x = torch.randn(sum(sizes), K, device=DEV).to(torch.bfloat16)
    dy = torch.randn(sum(sizes), N, device=DEV).to(torch.bfloat16)
    want = _wgrad_reference(x, dy, sizes)
    assert len(GG._WGRAD_ACC.configs) > 1
    for main_dtype in (torch.float32, torch.bfloat16):
        start = torch.randn(len(sizes), K, N, device=DEV).to(main_dtype)
        for cfg in GG._WGRAD_ACC.configs:
            mg = start.clone()
            GG.wgrad_accumulate_launch(x, dy, ends, mg, config=cfg)
            tol = 1e-4 if main_dtype == torch.float32 else BAND[torch.bfloat16]
            assert relerr(mg, start.double() + want) < tol, (cfg, main_dtype)
            assert torch.equal(mg[1], start[1]), cfg


def test_grouped_wgrad_accumulate_is_a_custom_op_that_passes_opcheck():
    from primus.turbo.grouped_gemm import grouped_wgrad_accumulate

    x = torch.randn(12, 16, device=DEV).to(torch.bfloat16)
    dy = torch.randn(12, 24, device=DEV).to(torch.bfloat16)
    ends = torch.tensor([5, 5, 12], device=DEV, dtype=torch.int32)
    torch.library.opcheck(grouped_wgrad_accumulate, (x, dy, ends, torch.zeros(16, 3 * 24, device=DEV)))


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch._grouped_mm missing")
def test_grouped_gemm_accumulate_compiles_into_one_graph(monkeypatch):
    """Under torch.compile (fullgraph) the GEMMs and the accumulation stay in the graph, main_grad mutated as in
    eager: what keeps a compiled MoE layer one graph with the fusion on."""
    from primus.turbo import _common
    from primus.turbo.grouped_gemm import grouped_gemm_accumulate

    if DEV == "cpu":
        monkeypatch.setattr(_common, "interpreting", lambda: False)
    sizes = torch.tensor([3, 0, 9], device=DEV)
    param = torch.randn(16, 3 * 32, device=DEV).to(torch.bfloat16).requires_grad_()
    x = torch.randn(12, 16, device=DEV).to(torch.bfloat16)

    def loss(x, param, main):
        y = grouped_gemm_accumulate(x, param.view(3, 16, 32), sizes, main, provider="torch")
        return y.float().square().sum()

    mains = [torch.zeros(16, 3 * 32, device=DEV) for _ in range(2)]
    loss(x, param, mains[0]).backward()
    torch._dynamo.reset()
    torch.compile(loss, backend="aot_eager", fullgraph=True)(x, param, mains[1]).backward()  # the graph's backward
    assert mains[0].abs().sum() > 0 and torch.equal(mains[0], mains[1])
    assert param.grad is None
