"""The cuBLAS-terms mapping the CUDA tuner relies on, checked on CPU against a column-major reference GEMM.

For each recorded problem the tuner fills flat A/B/C/D buffers, runs cuBLASLt on them and compares with the
torch call training made (`_torch_views`). Here a reference column-major GEMM stands in for cuBLASLt: if the
mapping (transposes, leading dims, batch strides, output view) were wrong, the two would disagree.
"""
import pytest
import torch

from tuning.cuda_tuner import CudaLtTuner, buffer_elems
from tuning.shapes import record_gemms


def colmajor_gemm(p, s):
    def mat(flat, rows, cols, ld, stride):
        if p.batch_count == 1:
            return flat.as_strided((rows, cols), (1, ld))
        return flat.as_strided((p.batch_count, rows, cols), (stride, 1, ld))

    ar, ac = (p.m, p.k) if p.transA == "N" else (p.k, p.m)
    br, bc = (p.k, p.n) if p.transB == "N" else (p.n, p.k)
    A = mat(s["a"], ar, ac, p.lda, p.stride_a)
    B = mat(s["b"], br, bc, p.ldb, p.stride_b)
    opA = A if p.transA == "N" else A.transpose(-1, -2)
    opB = B if p.transB == "N" else B.transpose(-1, -2)
    D = p.alpha * (opA @ opB)
    if p.beta:
        D = D + p.beta * mat(s["c"], p.m, p.n, p.ldc, p.stride_c)
    if p.bias_vector:
        D = D + s["bias"][:, None]
    mat(s["d"], p.m, p.n, p.ldd, p.stride_d).copy_(D)


def _recorded():
    torch.manual_seed(0)
    lin_b = torch.nn.Linear(12, 20)
    lin = torch.nn.Linear(20, 6, bias=False)
    x = torch.randn(2, 7, 12, requires_grad=True)
    a, b, c = torch.randn(3, 5, 4), torch.randn(3, 4, 6), torch.randn(3, 5, 6)
    with record_gemms(None) as rec:
        lin(torch.tanh(lin_b(x))).pow(2).sum().backward()
        torch.bmm(a, b)
        torch.baddbmm(c, a, b, beta=0.5)
        torch.addmm(torch.randn(5, 6), a[0], b[0], beta=2.0)
        torch.mm(a[0].t().contiguous().t(), b[0])  # column-major left operand
    return rec.results()


@pytest.mark.parametrize("p", _recorded(), ids=lambda p: p.label().replace(" ", "_"))
def test_torch_call_matches_column_major_reference(p):
    g = torch.Generator().manual_seed(1)
    na, nb, nc, nd = buffer_elems(p)
    s = {"a": torch.randn(na, generator=g), "b": torch.randn(nb, generator=g), "d": torch.zeros(nd)}
    s["c"] = torch.randn(nc, generator=g) if p.beta else s["d"]
    if p.bias_vector:
        s["bias"] = torch.randn(p.m, generator=g)
    call = CudaLtTuner._torch_views(p, s)
    assert call is not None
    colmajor_gemm(p, s)
    torch.testing.assert_close(CudaLtTuner._lt_output(p, s["d"]), call())


def test_recorded_set_covers_all_layouts():
    kinds = {(p.transA, p.transB, p.batch_count > 1, bool(p.bias_vector), p.beta != 0) for p in _recorded()}
    assert ("T", "N", False, True, False) in kinds      # linear forward with bias
    assert ("N", "N", False, False, False) in kinds     # dgrad
    assert ("N", "T", False, False, False) in kinds     # wgrad
    assert ("N", "N", True, False, True) in kinds       # baddbmm
