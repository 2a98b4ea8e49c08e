"""fp8 grouped GEMM on torch._scaled_grouped_mm (primus.turbo.grouped_gemm_fp8): its cast kernels vs float64 through
the interpreter, the provider rule, the autograd plumbing against an emulation of the op that enforces the upstream
layout rules (CPU), and the real CUTLASS op on an sm90 GPU vs a float64 per-expert loop."""
import pytest
import torch

from turbo_util import DEV, ON_GPU, relerr  # noqa: I001
from primus.turbo import grouped_gemm_fp8 as GF
from primus.turbo.grouped_gemm import fp8_grouped_gemm, grouped_gemm_reference

E4M3 = torch.float8_e4m3fn
FMAX = 448.0
SUBNORMAL = 2.0 ** -9  # e4m3's smallest step


def _check_quant(q, sinv, x, amax):
    """q (fp8) * sinv reproduces x within e4m3 rounding (half a step: 2^-4 relative, or a subnormal step), and
    sinv is amax / 448 (float64 amax of the same elements)."""
    sinv64 = sinv.double()
    torch.testing.assert_close(sinv64, amax.double().clamp_min(1e-12) / FMAX, rtol=1e-6, atol=0)
    deq = q.double() * sinv64
    x = x.double()
    bound = x.abs() * 2.0 ** -4 + sinv64 * SUBNORMAL + 1e-30
    assert ((deq - x).abs() <= bound).all(), (deq - x).abs().max()


def _sizes_ends(sizes):
    return torch.tensor(sizes, device=DEV).cumsum(0).to(torch.int32)


@pytest.mark.parametrize("transposed", [False, True])
def test_cast_experts_rows_along_the_last_dim(transposed):
    """(G, R, C) -> fp8 (G, R, C) contiguous, one scale per (expert, row) along C; a transposed view (the kernel
    here) and contiguous rows (fp8_linear.cast_rowwise) give the same layout."""
    torch.manual_seed(0)
    G, R, C = 3, 40, 48
    mag = torch.tensor([0.5, 8.0, 1e-3]).view(G, 1, 1)
    base = torch.randn(G, C, R) if transposed else torch.randn(G, R, C)
    w = (base * mag).to(DEV, torch.bfloat16)
    view = w.transpose(1, 2) if transposed else w  # (G, R, C)
    q, s = GF.cast_experts(view, E4M3)
    assert q.shape == (G, R, C) and q.is_contiguous() and q.dtype == E4M3 and s.shape == (G, R)
    _check_quant(q.cpu(), s.cpu()[..., None], view.cpu(), view.cpu().double().abs().amax(dim=2, keepdim=True))


@pytest.mark.parametrize("sizes", [[5, 0, 17, 3], [0, 0, 9], [16, 33], [0]])
def test_cast_groups_t_pads_each_expert_to_16(sizes):
    """(M, C) grouped by expert -> the transpose (C, MP), each expert's tokens at a padded offset (a multiple of 16,
    >= 16 for an empty expert) with zeros in its pad, one scale per (expert, column) along its own tokens."""
    torch.manual_seed(1)
    M, C, G = sum(sizes), 40, len(sizes)
    x = torch.randn(M, C, device=DEV).to(torch.bfloat16)
    for g, m in enumerate(sizes):  # experts of different magnitudes
        s0 = sum(sizes[:g])
        x[s0:s0 + m] *= 4.0 ** g
    ends = _sizes_ends(sizes)
    pends = GF.padded_ends(ends)
    padded = [max(16, (m + 15) // 16 * 16) for m in sizes]
    assert pends.dtype == torch.int32 and pends.tolist() == torch.tensor(padded).cumsum(0).tolist()
    MP = GF.padded_len(M, G)
    assert MP % 16 == 0 and MP >= sum(padded)
    yt, s = GF.cast_groups_t(x, ends, pends, MP, E4M3)
    assert yt.shape == (C, MP) and s.shape == (G, C)
    yt, s, x = yt.cpu(), s.cpu(), x.cpu()
    start = pstart = 0
    for g, (m, p) in enumerate(zip(sizes, padded)):
        blk = yt[:, pstart:pstart + p].float()
        assert torch.equal(blk[:, m:], torch.zeros_like(blk[:, m:])), f"expert {g}: pad not zero"
        xg = x[start:start + m].t()  # (C, m)
        amax = xg.double().abs().amax(dim=1, keepdim=True) if m else torch.zeros(C, 1, dtype=torch.float64)
        _check_quant(yt[:, pstart:pstart + m], s[g][:, None], xg, amax)
        start, pstart = start + m, pstart + p


def test_cast_tokens_matches_the_rowwise_cast():
    torch.manual_seed(2)
    x = (torch.randn(37, 64) * torch.logspace(-3, 2, 37)[:, None]).to(DEV, torch.bfloat16)
    q, s = GF.cast_tokens(x, E4M3)
    assert q.shape == (37, 64) and s.shape == (37,)
    _check_quant(q.cpu(), s.cpu()[:, None], x.cpu(), x.cpu().double().abs().amax(dim=1, keepdim=True))


# ---------------------------------------------------------------------------------------------- provider rule


def _plan(**kw):
    facts = dict(has_op=True, device_type="cuda", hip=False, capability=(9, 0), x_dtype=torch.bfloat16,
                 w_dtype=torch.bfloat16, dims=(4096, 14336), groups=8)
    facts.update(kw)
    return GF.plan(facts.pop("fmt", "e4m3"), **facts)


def test_provider_rule():
    assert _plan() == ("torch_scaled", _plan()[1]) and "CUTLASS sm90" in _plan()[1]
    for kw, why in [({"fmt": "hybrid"}, "e4m3 operands only"), ({"has_op": False}, "no torch._scaled_grouped_mm"),
                    ({"device_type": "cpu"}, "cpu device"), ({"hip": True}, "ROCm"),
                    ({"capability": (10, 0)}, "sm100"), ({"capability": (8, 9)}, "sm89"),
                    ({"capability": None}, "unknown GPU"), ({"x_dtype": torch.float32}, "bf16"),
                    ({"w_dtype": torch.float32}, "bf16"), ({"dims": (4096, 14344)}, "[14344]"),
                    ({"groups": 1024}, "fewer than 1024")]:
        prov, reason = _plan(**kw)
        assert prov == "triton" and why in reason, (kw, reason)
    # per call, on this machine: the CPU (interpreter) always takes the Triton kernels, and says why
    x, w = torch.randn(4, 32).bfloat16(), torch.randn(2, 32, 16).bfloat16()
    assert GF.fp8_grouped_choice(x, w, "e4m3") == ("triton", "cpu device (torch._scaled_grouped_mm is CUDA/ROCm only)")
    assert GF.fp8_grouped_provider(x, w, "hybrid") == "triton"
    assert "Triton" in GF.experts_summary("cpu", "e4m3", [(32, 16), (16, 32)], 2)


def test_torch_scaled_refuses_hybrid():
    x, w = torch.randn(4, 32).bfloat16(), torch.randn(2, 32, 16).bfloat16()
    with pytest.raises(ValueError, match="e4m3 operands only"):
        fp8_grouped_gemm(x, w, [2, 2], fmt="hybrid", provider="torch_scaled")
    with pytest.raises(ValueError, match="torch_scaled or triton"):
        fp8_grouped_gemm(x, w, [2, 2], fmt="e4m3", provider="cutlass")


# ------------------------------------------------------------------------------- the autograd path, emulated op


def _emulated_scaled_grouped_mm(calls):
    """torch._scaled_grouped_mm's rowwise semantics in float64, asserting the rules the CUDA op checks
    (GroupedBlas.cpp, GroupMMCommon.cuh): e4m3, A row-major, B column-major, dims % 16, int32 offsets, scale
    shapes, and for 2d x 2d every group but the last a positive multiple of 16."""

    def op(a, b, sa, sb, offs=None, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
        assert a.dtype == E4M3 and b.dtype == E4M3 and sa.dtype == torch.float32 and sb.dtype == torch.float32
        assert a.stride(-1) == 1 and a.stride(-2) >= a.shape[-1], "mat_a must be row-major"
        assert b.stride(-2) == 1 and b.stride(-1) >= b.shape[-2], "mat_b must be column-major"
        assert a.shape[-1] % 16 == 0 and b.shape[-2] % 16 == 0 and b.shape[-1] % 16 == 0
        assert offs is not None and offs.dtype == torch.int32 and offs.dim() == 1 and offs.device == a.device
        assert bias is None and scale_result is None and out_dtype == torch.bfloat16
        ends = offs.tolist()
        G = len(ends)
        a64, b64 = a.double(), b.double()
        if b.dim() == 3:  # 2d x 3d, groups along M
            M, N = a.shape[0], b.shape[2]
            assert sa.shape == (M,) and sa.is_contiguous() and sb.shape == (G, N) and sb.stride(1) == 1
            assert b.shape[0] == G and ends[-1] <= M
            out = torch.zeros(M, N, dtype=torch.float64, device=a.device)
            s = 0
            for g, e in enumerate(ends):
                out[s:e] = (a64[s:e] @ b64[g]) * sa[s:e, None].double() * sb[g][None, :].double()
                s = e
            calls.append(("2d3d", use_fast_accum))
        else:  # 2d x 2d, groups along K
            Mo, No = a.shape[0], b.shape[1]
            assert sa.shape == (Mo * G,) and sb.shape == (No * G,) and sa.is_contiguous() and sb.is_contiguous()
            out = torch.empty(G, Mo, No, dtype=torch.float64, device=a.device)
            s = 0
            for g, e in enumerate(ends):
                assert e - s > 0 and (g == G - 1 or (e - s) % 16 == 0), ("group along K", g, e - s)
                assert e <= a.shape[1] and e <= b.shape[0]
                out[g] = (a64[:, s:e] @ b64[s:e]) * sa[g * Mo:(g + 1) * Mo, None].double() \
                    * sb[g * No:(g + 1) * No][None, :].double()
                s = e
            calls.append(("2d2d", use_fast_accum))
        return out.to(torch.bfloat16)

    return op


def _run_vs_float64(sizes, K, N, trans_b, provider, check_calls=None):
    torch.manual_seed(0)
    G, M = len(sizes), sum(sizes)
    x = torch.randn(M, K, device=DEV).to(torch.bfloat16).requires_grad_()
    scale = torch.tensor([0.5, 4.0, 1.0, 2.0, 0.25][:G]).view(G, 1, 1)  # experts of different magnitudes
    w = ((torch.randn(G, N, K) if trans_b else torch.randn(G, K, N)) * scale / K ** 0.5).to(DEV, torch.bfloat16)
    w.requires_grad_()
    dy = torch.randn(M, N, device=DEV).to(torch.bfloat16)
    y = fp8_grouped_gemm(x, w, torch.tensor(sizes, device=DEV), trans_b=trans_b, fmt="e4m3", provider=provider)
    y.backward(dy)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    yr = grouped_gemm_reference(xd, wd, sizes, trans_b=trans_b)
    yr.backward(dy.double())
    assert y.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.bfloat16
    assert w.grad.shape == w.shape
    if M:  # the fp8 band of tests/test_turbo_fp8.py and test_turbo_grouped_gemm.py for e4m3 (0.08)
        assert relerr(y, yr) < 0.08
        assert relerr(x.grad, xd.grad) < 0.08
    for g, m in enumerate(sizes):  # per expert: its own scales show in its own gradient
        if m:
            assert relerr(w.grad[g], wd.grad[g]) < 0.08, g
        else:
            assert torch.equal(w.grad[g].float(), torch.zeros_like(w.grad[g].float())), g


@pytest.mark.parametrize("sizes,K,N", [([5, 0, 17, 3], 32, 48), ([33, 1], 16, 32), ([0, 0, 9], 48, 16),
                                       ([0, 0], 32, 16)])
@pytest.mark.parametrize("trans_b", [False, True])
def test_scaled_path_against_an_emulated_op(monkeypatch, sizes, K, N, trans_b):
    """_ScaledGroupedMM's casts, layouts, scales and padded wgrad offsets, with the CUDA op replaced by a float64
    emulation that enforces its rules: fwd and dgrad 2d x 3d (fast accumulation only in the forward), wgrad
    2d x 2d; the same fp8 band as the Triton fp8 path."""
    calls = []
    monkeypatch.setattr(torch, "_scaled_grouped_mm", _emulated_scaled_grouped_mm(calls), raising=False)
    _run_vs_float64(sizes, K, N, trans_b, "torch_scaled")
    if sum(sizes):
        assert calls == [("2d3d", True), ("2d3d", False), ("2d2d", False)], calls
    else:
        assert calls == []


# -------------------------------------------------------------------------------------------------- on the GPU


def _sm90_scaled() -> str:
    if not ON_GPU:
        return "needs a CUDA GPU (torch._scaled_grouped_mm is a CUTLASS sm90 kernel)"
    prov, why = GF.plan_for("cuda", "e4m3", (16,), 1)
    return "" if prov == "torch_scaled" else why


@pytest.mark.skipif(bool(_sm90_scaled()), reason=_sm90_scaled() or "ok")
@pytest.mark.parametrize("sizes,K,N", [([37, 0, 130, 5, 64], 256, 384), ([1, 300], 128, 512), ([0, 77, 0], 64, 96)])
@pytest.mark.parametrize("trans_b", [False, True])
def test_scaled_grouped_gemm_on_gpu(sizes, K, N, trans_b):
    """The real torch._scaled_grouped_mm (sm90): fwd, dgrad and wgrad vs float64, awkward expert sizes (empty
    experts, sizes not multiples of 16), within the fp8 e4m3 band; the provider picks it by itself."""
    x, w = torch.empty(1, K, device="cuda", dtype=torch.bfloat16), torch.empty(1, K, N, device="cuda",
                                                                                dtype=torch.bfloat16)
    assert GF.fp8_grouped_provider(x, w, "e4m3") == "torch_scaled"
    _run_vs_float64(sizes, K, N, trans_b, None)


# ------------------------------------------------------------------------------------ the experts' weight casts


@pytest.mark.parametrize("provider", ["triton", "torch_scaled"])
@pytest.mark.parametrize("trans_b", [False, True])
def test_expert_weight_casts_are_reused_until_cleared(monkeypatch, weight_casts, provider, trans_b):
    """The experts' fp8 weights under WEIGHT_CASTS (the megatron trainer's fp8 weight cache): two micro batches give
    the uncached outputs and gradients bit for bit with each cast made once (torch_scaled: w along K for the
    forward, along N for the dgrad; triton: one tensorwise cast per expert, reused by the backward). A weight
    changed through .data is served stale until clear(), then cast again. torch_scaled runs the real op on an sm90
    GPU, else the float64 emulation above."""
    if provider == "torch_scaled" and _sm90_scaled():
        monkeypatch.setattr(torch, "_scaled_grouped_mm", _emulated_scaled_grouped_mm([]), raising=False)
    torch.manual_seed(0)
    sizes, K, N = [5, 0, 17, 3], 32, 48
    G, M = len(sizes), sum(sizes)
    w0 = ((torch.randn(G, N, K) if trans_b else torch.randn(G, K, N)) / K ** 0.5).to(DEV, torch.bfloat16)
    xs = [(torch.randn(M, K) * (1 + i)).to(DEV, torch.bfloat16) for i in range(3)]
    dys = [torch.randn(M, N).to(DEV, torch.bfloat16) for _ in range(3)]
    counts = torch.tensor(sizes, device=DEV)

    def run(cached: bool, w, i):
        weight_casts.enabled = cached
        x = xs[i].clone().requires_grad_()
        y = fp8_grouped_gemm(x, w, counts, trans_b=trans_b, fmt="e4m3", provider=provider)
        y.backward(dys[i])
        out = (y.detach().clone(), x.grad, w.grad.clone())
        w.grad = None
        return out

    w_c, w_u = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    for i in range(2):  # two micro batches of one step
        got, want = run(True, w_c, i), run(False, w_u, i)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (provider, i)
    forms = 2 if provider == "torch_scaled" else 1
    assert (weight_casts.misses, weight_casts.hits) == (forms, forms)

    w_c.data.mul_(0.5)  # the optimizer step, as megatron writes it (no version bump)
    w_u.data.mul_(0.5)
    stale, fresh = run(True, w_c, 2), run(False, w_u, 2)
    assert not torch.equal(stale[0], fresh[0])
    weight_casts.clear()
    redone, want = run(True, w_c, 2), run(False, w_u, 2)
    assert all(torch.equal(a, b) for a, b in zip(redone, want)), provider
    assert weight_casts.misses == 2 * forms
