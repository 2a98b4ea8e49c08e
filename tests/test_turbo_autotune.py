"""`_common.queued_gpu_time`, the timer every tuned space's autotune uses (GPU only: it times on the device), and
`_common.autotune_picks`, the picks a run reports in result.json."""
import pytest
import torch

from turbo_util import DEV, ON_GPU  # noqa: I001  (sets TRITON_INTERPRET before triton imports)
from primus.turbo import _common
from primus.turbo import fp8_linear as F8

gpu_only = pytest.mark.skipif(not ON_GPU, reason="times kernels on a GPU")


def test_autotune_picks_name_kernel_call_and_config(monkeypatch):
    """Each remembered pick comes out as the kernel's qualified name, its autotune key by name, the call's constexprs
    and dtypes, and the config (the CPU's interpreter does not tune, so the pick is set by hand here)."""
    x = torch.zeros(300, 200, dtype=torch.bfloat16, device=DEV)
    args = (x, torch.zeros(200, device=DEV), 300, 200, x.stride(0))
    cfg = F8._COLMAX.space(args)[-1]
    monkeypatch.setattr(F8._COLMAX, "picked", {F8._COLMAX.call_key(args, {}): cfg})
    mine = [p for p in _common.autotune_picks() if p["kernel"] == "primus.turbo.fp8_linear._colmax"]
    assert mine == [{"kernel": "primus.turbo.fp8_linear._colmax", "key": {"R": 300, "C": 200}, "constexprs": {},
                     "dtypes": ["torch.bfloat16", "torch.float32"], "config": cfg,
                     "configs_in_space": len(F8._COLMAX.configs)}]
    assert all(t in _common.Tuned.spaces for t in (F8._COLMAX, F8._COLS_T, F8._TENSORWISE))


@gpu_only
def test_a_tuned_launch_reports_its_pick():
    x = torch.randn(4096, 1024, device="cuda").to(torch.bfloat16)
    F8._COLMAX.picked.clear()
    F8.column_amax(x)
    mine = [p for p in _common.autotune_picks() if p["kernel"].endswith("._colmax")]
    assert len(mine) == 1 and mine[0]["key"] == {"R": 4096, "C": 1024}
    assert mine[0]["config"] in F8._COLMAX.space((x, None, 4096, 1024))


@gpu_only
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


@gpu_only
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


@gpu_only
def test_a_turbo_run_reports_its_picks_in_result_json(tmp_path):
    """train.py with the turbo kernels on a GPU: result.json lists rank 0's autotuned picks, the RMSNorm forward's
    among them, each config one of its space's."""
    from rank_script import run_train
    from primus.turbo import rmsnorm

    res, _ = run_train(tmp_path, ["model=debug", "device=cuda", "turbo=megatron", "training.train_iters=2",
                                  "training.lr_warmup_iters=0", "logging.tensorboard=false"], timeout=600)
    norms = [p for p in res["turbo_autotune"] if p["kernel"] == "primus.turbo.rmsnorm._rmsnorm_fwd"]
    assert norms and all(p["config"] in rmsnorm._FWD.configs for p in norms), res["turbo_autotune"]


@gpu_only
def test_a_host_stall_is_not_timed():
    """The sleep that holds the GPU is sized from the first pass's host time. When the host later enqueues more
    slowly (here 0.5 ms of host time per launch after that pass), the GPU would wait on the host between the events
    and time it: such a measurement is retaken behind a longer sleep, so the result stays the kernel's time."""
    import time

    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    plain = _common.queued_gpu_time(lambda: y.copy_(x), quantiles=None)
    calls = [0]

    def stalling():
        calls[0] += 1
        if calls[0] > 21:  # after the compile call and the 20 launches of the pass that sizes the sleep
            time.sleep(5e-4)
        y.copy_(x)

    before = sum(_common.HOST_OUTRAN.values())
    stalled = _common.queued_gpu_time(stalling, quantiles=None)
    assert sum(_common.HOST_OUTRAN.values()) > before  # the stall was seen...
    assert stalled < 1.5 * plain + 2e-3, (stalled, plain)  # ...and not timed (it would add 0.5 ms a launch)


@gpu_only
def test_a_sleep_lasts_as_long_as_it_was_sized_for():
    """The timer sizes its sleep in GPU clock cycles. Calibrated once on an idle GPU, a cycle count meant for 1 ms
    slept 0.2 ms at the clocks kernels run at (H200, 2026-12-03); the timer now keeps the fastest clock it has seen,
    so a sleep sized after it has timed something lasts at least what it was sized for (at a slower clock, longer)."""
    x = torch.randn(1 << 24, device="cuda")
    y = torch.empty_like(x)
    _common.queued_gpu_time(lambda: y.copy_(x), quantiles=None)
    for _ in range(50):  # keep the GPU busy, as a sleep in the timer follows its own launches
        y.copy_(x)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(int(_common._SLEEP_CYCLES_PER_MS[torch.cuda.current_device()] * 2.0))
    b.record()
    torch.cuda.synchronize()
    assert a.elapsed_time(b) > 1.6, a.elapsed_time(b)


@gpu_only
def test_the_pass_before_a_kernel_is_launched_but_not_timed():
    """queued_gpu_time(before=...) runs `before` ahead of each timed launch, outside the events: a 256 MB read before
    a 4 MB copy adds none of its ~70 us."""
    big = torch.randn(1 << 26, device="cuda")
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    ran = [0]

    def before():
        ran[0] += 1
        big.sum()

    alone = _common.queued_gpu_time(lambda: y.copy_(x), quantiles=None)
    after = _common.queued_gpu_time(lambda: y.copy_(x), quantiles=None, before=before)
    assert ran[0] >= 20 * 8  # before every launch of the sizing pass and of the 7 measurements
    assert after < alone + 0.02, (after, alone)


@gpu_only
def test_the_transposed_rowwise_cast_tunes_after_its_column_amax_pass(monkeypatch):
    """_COLS_T's autotune launches the column amax pass of the same x before each timed launch (as the cast runs in
    use); once picked, a call runs no extra pass."""
    e4 = F8.fp8_dtypes("cuda")[0]
    x = torch.randn(4096, 2048, device="cuda").to(torch.bfloat16)
    seen = []
    real = F8._COLS_T.before
    monkeypatch.setattr(F8._COLS_T, "before", lambda args, consts: (seen.append(args[0]), real(args, consts)))
    F8._COLS_T.picked.clear()
    y, sinv = F8.cast_rowwise(x, e4, transpose=True, pad=True)
    assert seen and all(t.data_ptr() == x.data_ptr() and t.shape == x.shape for t in seen)  # x's own pass
    n = len(seen)
    y2, _ = F8.cast_rowwise(x, e4, transpose=True, pad=True)
    assert len(seen) == n and torch.equal(y.view(torch.uint8), y2.view(torch.uint8))
    assert torch.equal(sinv, F8.cast_rowwise(x, e4, transpose=True, pad=True, config=F8._COLS_T.configs[0])[1])
