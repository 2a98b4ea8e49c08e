"""Stage 3 on CPU: routing of linear GEMMs to the tuned executor, refusal of foreign results, switching."""
import pytest
import torch

from tuning import apply
from tuning.results_file import ResultsFile, append_row, read_results
from tuning.shapes import record_gemms
from tuning_fakes import FakeExecutor
from tuning_fakes import cuda_row as _cuda_row


@pytest.fixture
def linear_and_results(tmp_path):
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 16)
    x = torch.randn(4, 3, 8, requires_grad=True)
    with record_gemms(None) as rec:
        lin(x).pow(2).sum().backward()
    problems = rec.results()
    x.grad = lin.weight.grad = lin.bias.grad = None
    assert len(problems) == 3  # forward, dgrad, wgrad
    path = tmp_path / "results.txt"
    for p in problems:
        append_row(path, _cuda_row(p), "cublasLt-130100")
    yield lin, x, problems, path
    apply.uninstall_tuned_linear()


def test_install_routes_forward_dgrad_wgrad(linear_and_results):
    lin, x, problems, path = linear_and_results
    ref_out = lin(x)
    ref_out.pow(2).sum().backward()
    ref_grads = [x.grad.clone(), lin.weight.grad.clone(), lin.bias.grad.clone()]
    x.grad = lin.weight.grad = lin.bias.grad = None

    ex = FakeExecutor()
    original = torch.nn.functional.linear
    handle = apply.install_tuned_linear(path, executor=ex)
    assert torch.nn.functional.linear is apply.tuned_linear and handle.table_size == 3
    out = lin(x)
    out.pow(2).sum().backward()
    assert sorted(ex.seen) == sorted(p.tune_key() for p in problems)
    assert handle.stats() == {"tuned": 3}
    torch.testing.assert_close(out, ref_out)
    for got, want in zip((x.grad, lin.weight.grad, lin.bias.grad), ref_grads):
        torch.testing.assert_close(got, want)
    assert lin.weight.grad.is_contiguous()

    # a linear none of whose GEMMs was tuned stays torch's own F.linear (no custom-op dispatch)
    lin2 = torch.nn.Linear(8, 5)
    lin2(x)
    assert handle.stats() == {"tuned": 3, "untuned_linear": 1}

    handle.uninstall()
    assert torch.nn.functional.linear is original and not apply.is_installed()
    lin(x)
    assert len(ex.seen) == 3


@pytest.mark.parametrize("which", [0, 1, 2])
def test_one_tuned_gemm_routes_the_whole_linear(linear_and_results, tmp_path, which):
    """Only the forward, only the dgrad or only the wgrad problem tuned: the linear goes through the op, that GEMM
    runs tuned and the other two run torch's default inside it."""
    lin, x, problems, _ = linear_and_results
    path = tmp_path / f"only{which}.txt"
    append_row(path, _cuda_row(problems[which]), "cublasLt-130100")
    ex = FakeExecutor()
    handle = apply.install_tuned_linear(path, executor=ex)
    lin(x).pow(2).sum().backward()
    assert ex.seen == [problems[which].tune_key()]
    assert handle.stats() == {"tuned": 1, "default": 2}


def test_torch_compile_goes_through_the_op(linear_and_results):
    lin, x, problems, path = linear_and_results
    ex = FakeExecutor()
    apply.install_tuned_linear(path, executor=ex)
    compiled = torch.compile(lin, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    out.pow(2).sum().backward()
    assert sorted(ex.seen) == sorted(p.tune_key() for p in problems)


def test_autocast_casts_like_linear():
    w = torch.randn(16, 8)
    x = torch.randn(5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = apply.tuned_linear(x, w)
        want = torch.nn.functional.linear(x, w)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want)


def test_tuned_mm_matches_matmul():
    a, b = torch.randn(7, 5), torch.randn(5, 3)
    torch.testing.assert_close(apply.tuned_mm(a, b), a @ b)
    torch.testing.assert_close(apply.tuned_mm(a, b, torch.ones(3)), a @ b + 1)


def test_foreign_results_are_refused(linear_and_results):
    _, _, problems, path = linear_and_results
    res = read_results(path)
    apply.check_compatible(res, 130100, "NVIDIA H200")
    with pytest.raises(apply.TunedResultsMismatch, match="cuBLASLt.*130200"):
        apply.check_compatible(res, 130200, "NVIDIA H200")
    with pytest.raises(apply.TunedResultsMismatch, match="this GPU is 'NVIDIA H100"):
        apply.check_compatible(res, 130100, "NVIDIA H100 80GB HBM3")
    hip = ResultsFile("abc", [{k: v for k, v in r.items() if k not in ("library", "library_version")}
                              for r in res.rows])
    with pytest.raises(apply.TunedResultsMismatch, match="HIPBLASLT_TUNING_OVERRIDE_FILE"):
        apply.check_compatible(hip, 130100, "NVIDIA H200")
    assert apply.tuned_table(hip) != {}  # the algorithm columns are still there: only the check refuses it


def test_missing_results_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="run stage 2"):
        apply.install_tuned_linear(tmp_path / "nope.txt", executor=FakeExecutor())
    with pytest.raises(FileNotFoundError):
        apply.rocm_override_env(tmp_path / "nope.txt")
    f = tmp_path / "r.txt"
    f.write_text("Git Version: x\n")
    assert apply.rocm_override_env(f) == {"HIPBLASLT_TUNING_OVERRIDE_FILE": str(f.resolve())}


@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU machine: no cuBLASLt")
def test_install_without_library_fails_clearly(linear_and_results):
    from tuning.lt_library import LtLibraryNotFound
    _, _, _, path = linear_and_results
    with pytest.raises(LtLibraryNotFound):
        apply.install_tuned_linear(path)
    assert not apply.is_installed()
