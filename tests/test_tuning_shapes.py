"""Stage 1: the torch-level GEMM recorder, checked against shapes worked out by hand."""
import json

import torch

from tuning.shapes import load_shapes, record_gemms, rocm_dump_env, shape_file


def _key(p):
    return (p.transA, p.transB, p.m, p.n, p.k, p.lda, p.ldb, p.ldc, p.bias_vector)


def test_mlp_forward_backward_shapes_and_counts(tmp_path):
    torch.manual_seed(0)
    l1 = torch.nn.Linear(8, 16)                 # bias: addmm
    l2 = torch.nn.Linear(16, 16, bias=False)    # no bias, 3-D input: matmul folds to mm
    l3 = torch.nn.Linear(16, 16, bias=False)    # same problems as l2: counts add up
    x = torch.randn(3, 5, 8)                    # M = 15 tokens; x needs no grad, so l1 has no dgrad
    with record_gemms(tmp_path, rank=1, steps=2):
        for _ in range(2):
            y = l3(torch.relu(l2(torch.relu(l1(x)))))
            (y ** 2).sum().backward()

    problems = load_shapes(shape_file(tmp_path, 1))
    got = {_key(p): p.count for p in problems}
    # Row-major Y[M,N] = X[M,K] W^T is cuBLAS m=N, n=M, k=K, A=W (op T, ld K), B=X (op N, ld K), ld C = N.
    # dgrad dX[M,K] = dY[M,N] W[N,K]: m=K, n=M, k=N, both op N, lda=K, ldb=N.
    # wgrad dW[N,K] = dY^T X: m=K, n=N, k=M, A=X (op N, ld K), B=dY^T (op T, ld N).
    expected = {
        ("T", "N", 16, 15, 8, 8, 8, 16, 1): 1.0,     # l1 forward (with bias), once per step
        ("N", "T", 8, 16, 15, 8, 16, 8, 0): 1.0,     # l1 wgrad
        ("T", "N", 16, 15, 16, 16, 16, 16, 0): 2.0,  # l2 + l3 forward
        ("N", "N", 16, 15, 16, 16, 16, 16, 0): 2.0,  # l2 + l3 dgrad
        ("N", "T", 16, 16, 15, 16, 16, 16, 0): 2.0,  # l2 + l3 wgrad
    }
    assert got == expected
    assert all(p.a_type == p.b_type == p.d_type == "f32_r" and p.batch_count == 1 for p in problems)
    meta = json.loads(shape_file(tmp_path, 1).read_text().splitlines()[0])
    assert meta["rank"] == 1 and meta["steps"] == 2 and meta["errors"] == {}


def test_bmm_baddbmm_and_bf16(tmp_path):
    a = torch.randn(2, 3, 4, dtype=torch.bfloat16)
    b = torch.randn(2, 4, 5, dtype=torch.bfloat16)
    c = torch.randn(2, 3, 5, dtype=torch.bfloat16)
    with record_gemms(None) as rec:
        torch.bmm(a, b)
        torch.baddbmm(c, a, b, beta=0.5)
        torch.mm(a[0], b[0].t().contiguous().t())  # a column-major right operand
    (bmm, baddbmm, mm) = sorted(rec.results(), key=lambda p: (p.batch_count == 1, p.beta))
    # [B,M,K] @ [B,K,N]: m=N=5, n=M=3, k=4, A = b (op N, ld 5, batch stride 20), B = a (op N, ld 4, stride 12)
    assert (bmm.transA, bmm.transB, bmm.m, bmm.n, bmm.k, bmm.lda, bmm.ldb, bmm.ldc) == ("N", "N", 5, 3, 4, 5, 4, 5)
    assert (bmm.batch_count, bmm.stride_a, bmm.stride_b, bmm.stride_c) == (2, 20, 12, 15)
    assert bmm.a_type == "bf16_r" and bmm.compute_type == "f32_r"
    assert baddbmm.beta == 0.5 and baddbmm.batch_count == 2 and not baddbmm.bias_vector
    assert (mm.transA, mm.lda, mm.batch_count) == ("T", 4, 1)


def test_recorder_sees_tuned_linear_like_f_linear():
    from tuning.apply import tuned_linear
    w = torch.randn(16, 8, requires_grad=True)
    b = torch.randn(16, requires_grad=True)
    x = torch.randn(3, 5, 8, requires_grad=True)
    g = torch.randn(3, 5, 16)
    with record_gemms(None) as ours:
        tuned_linear(x, w, b).backward(g)
    with record_gemms(None) as ref:
        torch.nn.functional.linear(x, w, b).backward(g)
    assert ours.counts == ref.counts and len(ref.counts) == 3  # forward, dgrad, wgrad


def test_rocm_dump_env(tmp_path):
    env = rocm_dump_env(tmp_path / "tune", node_rank=2)
    assert env["HIPBLASLT_LOG_MASK"] == "32"
    assert env["HIPBLASLT_LOG_FILE"] == str(tmp_path / "tune" / "gemm_shape" / "dump_hipblaslt_gemm_shape_2.txt")
    assert env["HIPBLASLT_TUNING_OVERRIDE_FILE"] == ""  # set, and empty: the override is off while dumping
    assert (tmp_path / "tune" / "gemm_shape").is_dir()


def test_load_shapes_merges_ranks_and_hipblaslt_logs(tmp_path):
    from tests.test_tuning_formats import LOG_LINE
    lin = torch.nn.Linear(8, 4, bias=False)
    for rank, steps in ((0, 1), (1, 1)):
        with record_gemms(tmp_path, rank=rank, steps=steps):
            for _ in range(rank + 1):
                lin(torch.randn(6, 8))
    (tmp_path / "dump_hipblaslt_gemm_shape_0.txt").write_text(LOG_LINE + "\n" + LOG_LINE + "\n")
    problems = load_shapes(tmp_path)
    counts = sorted((p.m, p.count) for p in problems)
    assert counts == [(4, 2.0), (1024, 2.0)]  # rank 1 ran the linear twice: the busiest rank's count
