"""primus/patches/cpu_gemm.py: bf16 / fp16 GEMMs on a CPU without native ones run as fp32 GEMMs rounded once, for
the length of a run."""
import pytest
import torch

from primus.patches import CPU_LOW_PRECISION_GEMM, apply_cpu_patches, cpu_gemm
from primus.patches.registry import Conditions


@pytest.fixture
def route():
    """The replacement kernels, installed for one test (torch's own afterwards, whatever the test did)."""
    cpu_gemm.install()
    yield
    cpu_gemm.uninstall()


def _operands(dtype):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(37, 64, generator=g), torch.randn(64, 50, generator=g)
    c, bias = torch.randn(37, 50, generator=g), torch.randn(50, generator=g)
    ba, bb, bc = torch.randn(3, 37, 64, generator=g), torch.randn(3, 64, 50, generator=g), torch.randn(3, 37, 50,
                                                                                                        generator=g)
    return [t.to(dtype) for t in (a, b, c, bias, ba, bb, bc)]


def _calls(a, b, c, bias, ba, bb, bc):
    return {"mm": torch.mm(a, b), "addmm": torch.addmm(c, a, b, beta=0.5, alpha=2.0),
            "linear": torch.nn.functional.linear(a, b.t(), bias), "transposed": torch.mm(b.t(), a.t()),
            "bmm": torch.bmm(ba, bb), "baddbmm": torch.baddbmm(bc, ba, bb, beta=0.5, alpha=2.0),
            "matmul3d": ba @ b}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_gemms_are_the_fp32_gemm_rounded_once(route, dtype):
    ops = _operands(dtype)
    got = _calls(*ops)
    want = {k: v.to(dtype) for k, v in _calls(*(t.float() for t in ops)).items()}
    for name, v in got.items():
        assert v.dtype == dtype and v.shape == want[name].shape, name
        torch.testing.assert_close(v, want[name], rtol=0, atol=0, msg=name)


def test_other_dtypes_and_gradients_run_torchs_kernels(route):
    ops = _operands(torch.float32)
    cpu_gemm.uninstall()
    before = _calls(*ops)
    cpu_gemm.install()
    for name, v in _calls(*ops).items():
        assert torch.equal(v, before[name]), name
    a, b = (t.to(torch.bfloat16).requires_grad_() for t in ops[:2])
    (a @ b).float().sum().backward()  # autograd sits above the CPU key: the backward GEMMs take the route too
    ones = torch.ones(37, 50)
    torch.testing.assert_close(a.grad, (ones @ b.detach().float().t()).bfloat16(), rtol=0, atol=0)
    torch.testing.assert_close(b.grad, (a.detach().float().t() @ ones).bfloat16(), rtol=0, atol=0)
    with pytest.raises(RuntimeError):  # a dtype mismatch is still torch's error
        torch.mm(ops[0].bfloat16(), ops[1])


def test_uninstall_puts_torchs_kernels_back():
    a, b = _operands(torch.bfloat16)[:2]
    cpu_gemm.install()
    try:
        assert cpu_gemm.installed()
        assert torch.equal(torch.mm(a, b), (a.float() @ b.float()).bfloat16())
    finally:
        cpu_gemm.uninstall()
    assert not cpu_gemm.installed()
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::mm", "CPU")
    assert "primus" not in torch._C._dispatch_dump("aten::mm")  # no Python kernel of ours left registered


def test_applies_on_a_cpu_without_native_bf16_gemms_only(monkeypatch):
    monkeypatch.setattr(cpu_gemm, "native_low_precision_gemm", lambda: False)
    assert CPU_LOW_PRECISION_GEMM.applies(Conditions(device="cpu"))
    assert not CPU_LOW_PRECISION_GEMM.applies(Conditions(device="cuda"))
    assert apply_cpu_patches("cuda") is False and not cpu_gemm.installed()
    monkeypatch.setattr(cpu_gemm, "native_low_precision_gemm", lambda: True)
    assert not CPU_LOW_PRECISION_GEMM.applies(Conditions(device="cpu"))
    assert apply_cpu_patches("cpu") is False and not cpu_gemm.installed()


@pytest.mark.e2e  # the real run path, up to the trainer's construction, and its ending
def test_a_cpu_run_has_the_route_while_it_runs_and_not_after(monkeypatch, tmp_path):
    from conftest import run_path_to_setup

    monkeypatch.setattr(cpu_gemm, "native_low_precision_gemm", lambda: False)
    assert run_path_to_setup(monkeypatch, tmp_path, cpu_gemm.installed) is True
    assert not cpu_gemm.installed()
    assert "bf16 / fp16 GEMMs run as fp32 ones" in (tmp_path / "train.log").read_text()
