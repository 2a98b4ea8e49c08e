"""The fp8 GEMM that adds into fp32 in place (primus/turbo/cublaslt.py) and the fp8 linear / fused MLP ops that use
it for training.gradient_accumulation_fusion (fp8_ops._FP8LinearAccum, fp8_mlp._FusedMLPAccum).

On a GPU the add is cuBLASLt's epilogue, checked against torch._scaled_mm plus the add (fp32: the two differ only in
the order of fp32 rounding); on a CPU the module's own fallback runs, which is that sum, so the comparisons are
exact there. The ops' accumulated gradient is checked against the plain pair's fp32 weight gradient, and their
input gradient against the plain pair's bit for bit (the dgrad does not change).
"""
import pytest
import torch
import torch._dynamo

from turbo_util import DEV, ON_GPU  # noqa: I001
from primus.turbo import cublaslt
from primus.turbo import fp8_linear as F8
from primus.turbo.fp8_mlp import fp8_swiglu_mlp, fp8_swiglu_mlp_bwd_accum, fp8_swiglu_mlp_fwd
from primus.turbo.fp8_ops import fp8_linear_bwd, fp8_linear_bwd_accum, fp8_linear_fwd, fp8_linear_traced

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
TOL = dict(rtol=1e-5, atol=1e-5) if ON_GPU else dict(rtol=0, atol=0)


def _operands(M, K, N, a_dt=E5, b_dt=E4, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    a = (torch.randn(M, K, generator=g) * 8).to(DEV).to(a_dt)
    b = (torch.randn(N, K, generator=g) * 8).to(DEV).to(b_dt).t()  # (K, N) column-major
    sa, sb = torch.tensor(0.125, device=DEV), torch.tensor(0.5, device=DEV)
    out = torch.randn(M, N, generator=g).to(DEV)
    return out, a, b, sa, sb


@pytest.mark.parametrize("M,K,N", [(16, 16, 16), (48, 272, 80), (256, 4112, 128)])
@pytest.mark.parametrize("dts", [(E5, E4), (E4, E4), (E4, E5)])
def test_scaled_mm_add_is_scaled_mm_plus_the_add(M, K, N, dts):
    out, a, b, sa, sb = _operands(M, K, N, *dts)
    want = out + torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    ptr = out.data_ptr()
    got = cublaslt.scaled_mm_add_(out, a, b, sa, sb)
    assert got is out and out.data_ptr() == ptr  # in place
    torch.testing.assert_close(out, want, **TOL)


def test_scaled_mm_add_takes_views_with_wider_rows_and_less_aligned_pointers():
    """Operands whose row stride exceeds K (views of wider tensors) and an out 16 bytes past a 256-byte boundary
    (a main_grad inside megatron's grad buffer): the leading dimensions and alignments cuBLASLt is told are theirs,
    and nothing past out's view is written."""
    M, K, N, pad = 64, 96, 48, 32
    _, a_full, b_full, sa, sb = _operands(M, K + pad, N)
    a = a_full[:, :K]  # (M, K), row stride K + pad
    b = b_full[:K]  # (K, N) column-major, column stride K + pad
    buf = torch.randn(M * N + 8, device=DEV)
    out = buf[4:4 + M * N].view(M, N)
    want = buf.clone()
    want[4:4 + M * N] += torch._scaled_mm(a.contiguous(), b.t().contiguous().t(), scale_a=sa, scale_b=sb,
                                          out_dtype=torch.float32).flatten()
    cublaslt.scaled_mm_add_(out, a, b, sa, sb)
    torch.testing.assert_close(buf, want, **TOL)
    with pytest.raises(ValueError, match="at least K"):
        cublaslt.scaled_mm_add_(out, a_full.as_strided((M, K), (K - 16, 1)), b, sa, sb)  # rows overlap


@pytest.mark.skipif(not ON_GPU, reason="cuBLASLt is a CUDA library")
def test_cublaslt_is_what_runs_on_a_cuda_gpu():
    """On an NVIDIA GPU the in-GEMM add must be usable (else every accumulated gradient would take the unfused sum
    silently slower), and it runs cuBLASLt, not the fallback."""
    if torch.version.hip is not None:
        assert cublaslt.unusable(DEV) is not None
        return
    assert cublaslt.unusable(DEV) is None
    out, a, b, sa, sb = _operands(64, 128, 32)
    fallback = cublaslt._unfused
    cublaslt._unfused = None  # the cuBLASLt path must not reach it
    try:
        cublaslt.scaled_mm_add_(out, a, b, sa, sb)
    finally:
        cublaslt._unfused = fallback


def test_scaled_mm_add_refuses_what_it_cannot_take():
    out, a, b, sa, sb = _operands(32, 64, 48)
    with pytest.raises(ValueError, match="does not fit"):
        cublaslt.scaled_mm_add_(out[:, :16].contiguous(), a, b, sa, sb)
    with pytest.raises(ValueError, match="contiguous fp32"):
        cublaslt.scaled_mm_add_(out.bfloat16(), a, b, sa, sb)
    with pytest.raises(ValueError, match="contiguous fp32"):
        cublaslt.scaled_mm_add_(out.t().contiguous().t(), a, b, sa, sb)
    with pytest.raises(ValueError, match="column-major"):
        cublaslt.scaled_mm_add_(out, a, b.contiguous(), sa, sb)
    with pytest.raises(ValueError, match="tensorwise scales"):
        cublaslt.scaled_mm_add_(out, a, b, sa.expand(32, 1).contiguous(), sb)


def _linear_inputs(T, K, N, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(T, K, generator=g).to(DEV, torch.bfloat16)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(DEV, torch.bfloat16)
    dy = torch.randn(T, N, generator=g).to(DEV, torch.bfloat16)
    return x, w, dy


@pytest.mark.parametrize("fmt", ["e4m3", "hybrid"])
@pytest.mark.parametrize("T,K,N", [(37, 64, 48), (130, 32, 80)])
def test_fp8_linear_adds_its_weight_gradient_into_main_grad(T, K, N, fmt):
    """Two micro batches: main_grad ends at its start plus both fp32 weight gradients of the plain pair (computed
    with an fp32 output), the weight gets no gradient, and dx is the plain pair's bit for bit."""
    x, w, dy = _linear_inputs(T, K, N)
    start = torch.randn(N, K, device=DEV)
    mg = start.clone()
    want = start.clone()
    for i in range(2):
        xi, wi = (x * (1 + i)).requires_grad_(), w.clone().requires_grad_()
        y = fp8_linear_traced(xi, wi, None, "tensorwise", fmt, main_grad=mg)
        y.backward(dy)
        assert wi.grad is None
        _, a, b, c, d = fp8_linear_fwd(x * (1 + i), w, "tensorwise", fmt)
        dx_plain, dw32 = fp8_linear_bwd(dy, a, b, c, d, "tensorwise", fmt, torch.float32)
        want += dw32
        assert torch.equal(xi.grad, dx_plain)
        assert torch.equal(y, fp8_linear_traced(x * (1 + i), w, None, "tensorwise", fmt))
    torch.testing.assert_close(mg, want, **TOL)


def test_fp8_linear_refuses_a_main_grad_it_cannot_add_into():
    x, w, _ = _linear_inputs(16, 32, 48)
    for bad, recipe in ((torch.zeros(48, 32, device=DEV, dtype=torch.bfloat16), "tensorwise"),
                        (torch.zeros(32, 48, device=DEV), "tensorwise"),
                        (torch.zeros(48, 32, device=DEV), "rowwise")):
        with pytest.raises(ValueError, match="fp32 accumulator"):
            fp8_linear_traced(x, w, None, recipe, "e4m3", main_grad=bad)


@pytest.mark.parametrize("fmt", ["e4m3", "hybrid"])
def test_fused_mlp_adds_both_weight_gradients_into_their_main_grads(fmt):
    g = torch.Generator(device="cpu").manual_seed(1)
    T, H, F = 37, 64, 48
    x = torch.randn(T, H, generator=g).to(DEV, torch.bfloat16)
    w1 = (torch.randn(2 * F, H, generator=g) / H ** 0.5).to(DEV, torch.bfloat16)
    w2 = (torch.randn(H, F, generator=g) / F ** 0.5).to(DEV, torch.bfloat16)
    dout = torch.randn(T, H, generator=g).to(DEV, torch.bfloat16)
    mg1, mg2 = torch.randn(2 * F, H, device=DEV), torch.randn(H, F, device=DEV)
    start1, start2 = mg1.clone(), mg2.clone()
    xi, w1i, w2i = x.clone().requires_grad_(), w1.clone().requires_grad_(), w2.clone().requires_grad_()
    out = fp8_swiglu_mlp(xi, w1i, w2i, fmt, main_grads=(mg1, mg2))
    out.backward(dout)
    assert w1i.grad is None and w2i.grad is None
    _, *saved = fp8_swiglu_mlp_fwd(x, w1, w2, fmt)
    from primus.turbo.fp8_mlp import fp8_swiglu_mlp_bwd

    dx, dw1, dw2 = fp8_swiglu_mlp_bwd(dout, *saved, fmt, torch.float32)
    assert torch.equal(xi.grad, dx)
    torch.testing.assert_close(mg1, start1 + dw1, **TOL)
    torch.testing.assert_close(mg2, start2 + dw2, **TOL)
    with pytest.raises(ValueError, match="main_grads"):
        fp8_swiglu_mlp(x, w1, w2, fmt, main_grads=(mg2, mg1))


def test_accumulating_ops_fakes_match_and_compile_without_graph_breaks():
    """opcheck's fake-tensor test for both accumulating backward ops, and the linear and the fused MLP with their
    main_grads under torch.compile(fullgraph=True) add what they add eagerly."""
    x, w, dy = _linear_inputs(40, 32, 48)
    checks = ("test_faketensor",)
    _, a, b, c, d = fp8_linear_fwd(x, w, "tensorwise", "e4m3")
    mg = torch.zeros(48, 32, device=DEV)
    assert torch.library.opcheck(fp8_linear_bwd_accum, (dy, a, b, c, d, mg, "e4m3", torch.bfloat16),
                                 test_utils=checks) == {"test_faketensor": "SUCCESS"}
    w1, w2 = torch.randn(64, 32, device=DEV, dtype=torch.bfloat16), torch.randn(32, 32, device=DEV,
                                                                                  dtype=torch.bfloat16)
    _, h, *saved = fp8_swiglu_mlp_fwd(x, w1, w2, "e4m3")
    mg2 = torch.zeros(32, 32, device=DEV)
    assert torch.library.opcheck(fp8_swiglu_mlp_bwd_accum, (dy[:, :32].contiguous(), h, *saved[4:], mg2, "e4m3",
                                                            torch.bfloat16), test_utils=checks) == \
        {"test_faketensor": "SUCCESS"}

    def step(x, w, w1, w2, mg, mg1, mg2):
        h = fp8_linear_traced(x, w, None, "tensorwise", "hybrid", main_grad=mg)
        return fp8_swiglu_mlp(h[:, :32], w1, w2, "hybrid", main_grads=(mg1, mg2)).float().square().sum()

    results = []
    for fn in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        torch._dynamo.reset()
        mgs = [torch.zeros(48, 32, device=DEV), torch.zeros(64, 32, device=DEV), torch.zeros(32, 32, device=DEV)]
        xi = x.clone().requires_grad_()
        fn(xi, w.requires_grad_(), w1.requires_grad_(), w2.requires_grad_(), *mgs).backward()
        assert w.grad is None and w1.grad is None and w2.grad is None
        assert all(m.abs().sum() > 0 for m in mgs)
        results.append((xi.grad, *mgs))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.e2e
def test_bench_entry_smoke_runs_on_cpu():
    """bench/turbo_kernels.py --smoke --only fp8_wgrad_accum: the bench entry runs end to end on a CPU (the
    interpreter, tiny sizes, the fallback named in its rows) and prints its rows, the all-linears total included."""
    from conftest import turbo_kernels_smoke

    rows = turbo_kernels_smoke("fp8_wgrad_accum")
    assert len(rows) == 2 and "fallback: cpu is not a CUDA device" in rows[0] and "all 4 linears" in rows[1], rows


def test_inductor_adds_into_main_grads_that_share_one_buffer_in_place():
    """megatron's main_grads are views of one grad buffer. A custom op's mutable arguments must not alias each other,
    so an op mutating two of them made Inductor clone one through as_strided and copy it back (on an H100 that copy
    faulted once the views sat gigabytes into the buffer). Each accumulating op mutates one main_grad: in the
    compiled backward every one of them is handed its main_grad itself (no as_strided copy), and two layers sharing
    the compiled code add what they add eagerly, nothing outside their views touched."""
    from torch._inductor.utils import run_and_get_code

    g = torch.Generator(device="cpu").manual_seed(3)
    T, H, F = 48, 32, 48
    shapes = [(H, H), (2 * F, H), (H, F)] * 2  # per layer: a linear, the fused MLP's w1 and w2
    weights = [(torch.randn(*s, generator=g) / s[1] ** 0.5).to(DEV, torch.bfloat16).requires_grad_() for s in shapes]
    x = torch.randn(T, H, generator=g).to(DEV, torch.bfloat16)

    def layer(h, w, w1, w2):
        h = fp8_linear_traced(h, w, None, "tensorwise", "hybrid", main_grad=w.main_grad)
        return fp8_swiglu_mlp(h, w1, w2, "hybrid", main_grads=(w1.main_grad, w2.main_grad))

    # on a GPU the views sit past 2 GiB into the buffer, as a 16-layer model's do in megatron's
    lead = (1 << 29) + 64 if ON_GPU else 0

    def step(fn):
        n = sum(w.numel() for w in weights)
        buf = torch.full((lead + n + 64,), 7.0, device=DEV)  # 64 sentinels past the views
        buf[lead:lead + n] = 0
        off = lead
        for w in weights:
            w.main_grad = buf[off:off + w.numel()].view(w.shape)
            off += w.numel()
        for _ in range(2):  # two micro batches
            xi = x.clone().requires_grad_()
            fn(fn(xi, *weights[:3]), *weights[3:]).float().square().sum().backward()
        assert all(w.grad is None for w in weights)
        return buf

    torch._dynamo.reset()
    want = step(layer)
    got, codes = run_and_get_code(lambda: step(torch.compile(layer, fullgraph=True)))
    torch.testing.assert_close(got[lead:], want[lead:], **TOL)
    assert torch.all(got[-64:] == 7.0) and torch.all(got[:lead] == 7.0)
    calls = [line for code in codes for line in code.splitlines() if "_bwd_accum.default(" in line]
    assert len(calls) == 3 and all("primals_" in c for c in calls), calls  # the linear's, fc2's, fc1's
    # (get_args, Inductor's benchmark harness, rebuilds the aliased inputs with torch.as_strided: not a copy)
    copies = [line for code in codes for line in code.splitlines()
              if "as_strided" in line and "torch.as_strided(_shared_storage" not in line]
    assert not copies, copies
