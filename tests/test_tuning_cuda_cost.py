"""The CUDA tuner's cost controls on CPU: chunked output comparison, pruning and per-candidate timing plans."""
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tuning.cuda_tuner import MIN_ITERS, rel_err, should_prune, timing_plan


def _direct(x, ref):
    x, ref = x.double(), ref.double()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


class _NewAllocations(TorchDispatchMode):
    """Largest storage (bytes) any op allocates, besides the storages of the given tensors."""

    def __init__(self, *known):
        super().__init__()
        self.known = {t.untyped_storage().data_ptr() for t in known}
        self.max_bytes, self.ops = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.known:
                self.max_bytes = max(self.max_bytes, t.untyped_storage().nbytes())
        return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape,chunk", [((37, 53), 200), ((5, 7, 11), 30), ((1000,), 64), ((3, 4, 5), 1000),
                                         ((6, 9), 1), ((4, 3, 2, 5), 7)])
def test_rel_err_chunked_equals_direct_without_full_copies(shape, chunk, dtype):
    g = torch.Generator().manual_seed(sum(shape) + chunk)
    ref = torch.randn(shape, generator=g).to(dtype)
    x = (ref.float() + 0.05 * torch.randn(shape, generator=g)).to(dtype)
    x_before = x.clone()
    with _NewAllocations(x, ref) as mode:
        got = rel_err(x, ref, chunk_elems=chunk)
    want = _direct(x, ref)
    assert want > 1e-3  # a real difference, not 0 == 0
    assert got == pytest.approx(want, rel=1e-5)
    assert got == pytest.approx(rel_err(x, ref), rel=1e-5)  # default chunk: one piece here
    assert torch.equal(x, x_before)  # the fp32 input is not changed in place
    assert mode.ops > 0 and 0 < mode.max_bytes <= 4 * chunk + 8  # chunk-sized fp32 temporaries (or a scalar)


def test_rel_err_on_strided_output_views_ignores_the_gaps():
    # the tuner compares D through its (ldd, 1) view: padding between rows must not count (here it is NaN)
    n, m, ldd = 9, 13, 16
    g = torch.Generator().manual_seed(3)
    ref_flat = torch.full((n * ldd,), float("nan"))
    x_flat = torch.full((n * ldd,), float("nan"))
    ref, x = ref_flat.as_strided((n, m), (ldd, 1)), x_flat.as_strided((n, m), (ldd, 1))
    ref.copy_(torch.randn(n, m, generator=g))
    x.copy_(ref + 0.01 * torch.randn(n, m, generator=g))
    got = rel_err(x, ref, chunk_elems=20)
    assert math.isfinite(got) and got == pytest.approx(_direct(x.contiguous(), ref.contiguous()), rel=1e-5)


def test_rel_err_special_values():
    z = torch.zeros(4, 5)
    assert rel_err(z, z, chunk_elems=3) == 0.0
    assert rel_err(z + 1, z, chunk_elems=3) == pytest.approx(math.sqrt(20) / 1e-30)  # the 1e-30 floor
    bad = torch.ones(4, 5)
    bad[3, 4] = float("nan")
    assert math.isnan(rel_err(bad, torch.ones(4, 5), chunk_elems=3))  # rejected by `not err <= tol`
    bad[3, 4] = float("inf")
    assert not rel_err(bad, torch.ones(4, 5), chunk_elems=3) <= 1.0
    with pytest.raises(ValueError):
        rel_err(torch.ones(4, 5), torch.ones(5, 4))


def test_should_prune_boundaries():
    assert not should_prune(5.0, math.inf)            # nothing timed yet
    assert not should_prune(125.0, 100.0, 1.25)       # exactly at the factor: kept
    assert should_prune(125.01, 100.0, 1.25)
    assert not should_prune(99.0, 100.0, 1.25)
    assert should_prune(math.inf, 100.0)
    assert not should_prune(float("nan"), 100.0)      # no estimate: time it
    assert should_prune(150.0, 100.0, 1.4) and not should_prune(150.0, 100.0, 1.6)


def test_timing_plan_boundaries():
    # fast GEMMs get the full count
    assert timing_plan(1.0, 20, 5, budget_s=0.15) == (20, 5)
    # 15 ms in a 150 ms budget: 10 timed calls, warm-ups in proportion (ceil(5 * 10 / 20) = 3)
    assert timing_plan(15_000.0, 20, 5, budget_s=0.15) == (10, 3)
    assert timing_plan(15_001.0, 20, 5, budget_s=0.15) == (9, 3)
    # slow GEMMs: at least 3 timed calls and 1 warm-up
    assert timing_plan(51_000.0, 10, 3, budget_s=0.15) == (MIN_ITERS, 1) == (3, 1)
    assert timing_plan(5e6, 20, 5) == (3, 1)
    assert timing_plan(math.inf, 20, 5) == (3, 1)
    # never above the configured counts, never below them when they are smaller than the minimum
    assert timing_plan(1.0, 2, 1) == (2, 1)
    assert timing_plan(1e9, 2, 1) == (2, 1)
    assert timing_plan(1e9, 20, 0) == (3, 0)  # warm-up off stays off
    # no usable estimate: the configured counts
    assert timing_plan(0.0, 20, 5) == (20, 5)
    assert timing_plan(float("nan"), 20, 5) == (20, 5)
    # the budget bounds the timed work whenever the minimum allows it
    for est in (100.0, 7_000.0, 21_428.0, 49_999.0):
        iters, warmup = timing_plan(est, 20, 5, budget_s=0.15)
        assert iters * est <= 0.15e6 and 1 <= warmup <= 5
