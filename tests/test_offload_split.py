"""The offloaded optimizer step's parts (primus/backends/megatron/offload_split.py): megatron-core's
HybridDeviceOptimizer found inside the optimizer chain, and its CPU sub-optimizers' steps and the waits before them
timed on the host, with the sub-optimizers' own steps and hooks still run. The HybridDeviceOptimizer's own step
needs CUDA streams: here one of its instances gets a step with the same order of calls (queue the copies, step the
GPU share, then per CPU shard wait and step), the waits and the CPU Adam slowed by known sleeps."""
import time
from types import SimpleNamespace

import pytest
import torch

from primus.backends.megatron import offload_split

WAIT, ADAM, QUEUE = 0.03, 0.04, 0.02


def _hybrid(n_cpu: int = 2):
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    h = HybridDeviceOptimizer.__new__(HybridDeviceOptimizer)  # no CUDA: its __init__ makes streams
    params = [torch.nn.Parameter(torch.ones(4)) for _ in range(n_cpu + 1)]
    for p in params:
        p.grad = torch.ones(4)
    h.gpu_optimizer = torch.optim.SGD([params[0]], lr=0.1)
    h.cpu_optimizers = [torch.optim.AdamW([p], lr=0.1) for p in params[1:]]
    h.post_hooks_run = []
    for i, sub in enumerate(h.cpu_optimizers):
        sub.register_step_pre_hook(lambda *_: time.sleep(ADAM))
        sub.register_step_post_hook(lambda *_, i=i: h.post_hooks_run.append(i))  # megatron queues its H2D here

    def step(closure=None):  # HybridDeviceOptimizer.step's order of calls
        time.sleep(QUEUE)  # the D2H copies queued
        h.gpu_optimizer.step(closure)
        for sub in h.cpu_optimizers:
            time.sleep(WAIT)  # d2h_event.synchronize()
            sub.step(closure)

    h.step = step
    return h, params


def test_the_hybrid_optimizer_is_found_through_megatrons_wrappers():
    h, _ = _hybrid()
    chain = SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=torch.optim.SGD(
        [torch.nn.Parameter(torch.ones(1))], lr=1.0)), SimpleNamespace(optimizer=h)])
    assert offload_split.hybrid_optimizers(chain) == [h]

    class Chained:  # megatron-core 0.16.1's ChainedOptimizer: `optimizer` asserts once it chains more than one
        chained_optimizers = chain.chained_optimizers

        @property
        def optimizer(self):
            raise AssertionError("ChainedOptimizer has more than one optimizer when accessing self.optimizer")

    assert offload_split.hybrid_optimizers(Chained()) == [h]
    assert offload_split.install(SimpleNamespace(optimizer=torch.optim.SGD(
        [torch.nn.Parameter(torch.ones(1))], lr=1.0))) is None  # nothing offloaded: no split


def test_cpu_adam_and_the_waits_before_it_are_timed_and_the_parts_add_up():
    h, params = _hybrid(n_cpu=2)
    split = offload_split.install(SimpleNamespace(optimizer=h))
    assert split is not None
    for _ in range(2):  # a second step starts from zero
        split.start()
        t0 = time.perf_counter()
        h.step()  # megatron's MixedPrecisionOptimizer calls its inner optimizer's step
        total = time.perf_counter() - t0
        parts = split.parts(total)
        assert set(parts) == {"cpu_adam_s", "d2h_wait_s", "rest_s"}
        assert parts["cpu_adam_s"] >= 2 * ADAM and parts["d2h_wait_s"] >= 2 * WAIT
        assert parts["rest_s"] >= QUEUE  # queued before the GPU share: not a wait on a shard's gradients
        assert sum(parts.values()) == pytest.approx(total)
    # the sub-optimizers' own steps ran, with their hooks: each CPU shard updated twice, its post hook run
    assert h.post_hooks_run == [0, 1, 0, 1]
    assert all(not torch.equal(p.data, torch.ones(4)) for p in params)


def test_sub_optimizers_rebuilt_by_a_checkpoint_load_are_timed_too():
    """HybridDeviceOptimizer's load_state_dict post hook builds new sub-optimizers (megatron-core 0.16.1): the next
    step's start() wraps them; a wrapped one is not wrapped twice (its time would count twice)."""
    h, _ = _hybrid(n_cpu=1)
    split = offload_split.install(SimpleNamespace(optimizer=h))
    fresh, _ = _hybrid(n_cpu=1)
    h.cpu_optimizers, h.gpu_optimizer = fresh.cpu_optimizers, fresh.gpu_optimizer  # as _init_sub_optimizers does
    for _ in range(2):
        split.start()
        t0 = time.perf_counter()
        h.step()
        parts = split.parts(time.perf_counter() - t0)
        assert parts["cpu_adam_s"] >= ADAM and parts["d2h_wait_s"] >= WAIT, parts
        for opt in (h, h.gpu_optimizer, h.cpu_optimizers[0]):  # one wrapper each, over the optimizer's own step
            assert opt.step._primus_offload_split and not hasattr(opt.step.__wrapped__, "_primus_offload_split")
