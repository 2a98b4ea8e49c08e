"""`_common.queued_gpu_time`, the timer every tuned space's autotune uses (GPU only: it times on the device)."""
import pytest
import torch

from turbo_util import ON_GPU  # noqa: I001  (sets TRITON_INTERPRET before triton imports)
from primus.turbo import _common

pytestmark = pytest.mark.skipif(not ON_GPU, reason="times kernels on a GPU")


def test_flushed_timing_reads_from_memory_not_l2():
    """A copy whose source and destination fit in the L2 together: timed back to back it runs from the L2; with the
    L2 flushed before each launch (the autotune's form) it must take longer, as it does on cold data in training."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    n = l2 // 4 // 2  # bf16 elements: source + destination = half the L2
    x = torch.randn(n, device="cuda").to(torch.bfloat16)
    y = torch.empty_like(x)
    warm = _common.queued_gpu_time(lambda: y.copy_(x), quantiles=None, flush_l2=False)
    cold = _common.queued_gpu_time(lambda: y.copy_(x), quantiles=None)
    assert cold > 1.15 * warm, (cold, warm)


def test_timing_is_per_launch_and_returns_quantiles():
    """Twice the work takes about twice the time in both forms (the launches are timed, not the host), and the
    quantiles come back in the order asked for."""
    x = torch.randn(1 << 26, device="cuda")  # 256 MB: larger than any L2, so the two forms time the same reads
    for flush in (False, True):
        one = _common.queued_gpu_time(lambda: x[: 1 << 25].sum(), quantiles=None, flush_l2=flush)
        two = _common.queued_gpu_time(lambda: x.sum(), quantiles=None, flush_l2=flush)
        assert 1.6 < two / one < 2.4, (flush, one, two)
        med, lo, hi = _common.queued_gpu_time(lambda: x.sum(), flush_l2=flush)
        assert lo <= med <= hi
