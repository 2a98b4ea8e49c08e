"""Megatron checkpoints through megatron.core.dist_checkpointing, the way Megatron-LM writes them.

One sharded state dict: the model chunks (`model`, or `model0`, `model1`, ... with virtual pipeline stages), the
optimizer's sharded state built from it (`optimizer.sharded_state_dict(state)`), and common (rank-0) state: the
OptimizerParamScheduler's state_dict and the data position (micro batches consumed, `MicroBatches.next_micro`).
`dist_checkpointing.save/load` write and read it under `<tmp>/megatron/` (torch_dist format, resharding across
tp/pp/dp comes with it). Per-rank state megatron keeps outside torch's RNGs (the tensor-parallel RNG tracker) goes
to `megatron_rng/rank_N.pt`.

Also the non-finite guard for `training.on_nonfinite=skip`: megatron's optimizer.step() already returns
(False, None, None) without updating when `prepare_grads()` reports inf/NaN (the fp16 loss-scaler path); the guard
extends this optimizer's prepare_grads to report a non-finite grad norm as well, so bf16/fp32 runs skip the update
(and the scheduler, which the trainer only steps on success) the same way.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Dict, Optional

import torch

from primus.launch.dist import barrier

CKPT_DIR = "megatron"


def _chunks(tr):
    """The model chunks inside megatron's DDP wrapper (Float16Module or GPTModel): DDP's own sharded_state_dict
    would prefix every key with 'module.'; Megatron-LM saves and loads the unwrapped keys."""
    return [getattr(m, "module", m) for m in tr.model]


def _sharded_state_dict(tr, is_loading: bool) -> Dict[str, Any]:
    """The checkpoint's entries; without the optimizer and scheduler when checkpoint.no_save_optim (saving) or
    checkpoint.no_load_optim (loading) says so, as Megatron-LM's switches of the same names."""
    c = tr.args["checkpoint"]
    with_optim = not (c["no_load_optim"] if is_loading else c["no_save_optim"])
    sd: Dict[str, Any] = {}
    chunks = _chunks(tr)
    if len(chunks) == 1:
        sd["model"] = chunks[0].sharded_state_dict()
    else:
        for i, m in enumerate(chunks):
            sd[f"model{i}"] = m.sharded_state_dict()
    if with_optim:
        sd["optimizer"] = tr.optimizer.sharded_state_dict(sd, is_loading=is_loading)
        sd["scheduler"] = tr.scheduler.state_dict()
    # the position as samples consumed too: a rank's next_micro counts rows of micro_batch_size x dp samples, which
    # a resume at another dp (or micro batch) size must convert (MicroBatches reads rows in Megatron-LM's order)
    sd["data"] = {"next_micro": [it.next_micro for it in tr.iters],
                  "consumed_samples": [it.next_micro * it.mbs * it.dp for it in tr.iters]}
    return sd


@contextlib.contextmanager
def _cpu_safe():
    """On CPU, dist_checkpointing's torch_dist strategy calls torch.cuda.synchronize / current_device and builds
    `device='cuda'` flags (platform facts of megatron-core 0.16.1). The megatron backend's CPU redirections
    (patches/cpu.py) rebind `torch` in megatron modules already imported: import the checkpointing modules, then
    refresh it so they are covered too. Nothing happens on a GPU machine."""
    if not torch.cuda.is_available():
        import megatron.core.dist_checkpointing.strategies.async_utils  # noqa: F401
        import megatron.core.dist_checkpointing.strategies.filesystem_async  # noqa: F401
        import megatron.core.dist_checkpointing.strategies.fully_parallel  # noqa: F401
        import megatron.core.dist_checkpointing.strategies.state_dict_saver  # noqa: F401
        import megatron.core.dist_checkpointing.strategies.torch  # noqa: F401
        import megatron.core.dist_checkpointing.exchange_utils  # noqa: F401
        import megatron.core.dist_checkpointing.tensor_aware_state_dict  # noqa: F401
        from primus.backends.megatron import patches

        patches.refresh()
    yield


def _rng_tracker_file(path: str, rank: int) -> str:
    return os.path.join(path, "megatron_rng", f"rank_{rank:05d}.pt")


def save(tr, path: str, step: int) -> Dict[str, Any]:
    from megatron.core import dist_checkpointing, tensor_parallel

    sd = _sharded_state_dict(tr, is_loading=False)
    d = os.path.join(path, CKPT_DIR)
    if torch.distributed.get_rank() == 0:
        os.makedirs(d, exist_ok=True)
    barrier()
    with _cpu_safe():
        dist_checkpointing.save(sd, d)
    rank = torch.distributed.get_rank()
    try:
        states = None if tr.cfg.checkpoint.no_save_rng else tensor_parallel.get_cuda_rng_tracker().get_states()
    except Exception:  # noqa: BLE001 - no tracker state on this platform
        states = None
    if states:
        os.makedirs(os.path.dirname(_rng_tracker_file(path, rank)), exist_ok=True)
        torch.save(states, _rng_tracker_file(path, rank))
    return {"step": step, "next_micro": sd["data"]["next_micro"],
            "consumed_samples": sd["data"]["next_micro"][0] * tr.args["schedule"]["micro_batch_size"]
            * tr.ps.get_data_parallel_world_size(),
            "scheduler_num_steps": sd["scheduler"].get("num_steps") if "scheduler" in sd else None}


def load(tr, path: str) -> Dict[str, Any]:
    from megatron.core import dist_checkpointing, tensor_parallel

    sd = _sharded_state_dict(tr, is_loading=True)
    with _cpu_safe():
        state = dist_checkpointing.load(sd, os.path.join(path, CKPT_DIR))
    chunks = _chunks(tr)
    if len(chunks) == 1:
        chunks[0].load_state_dict(state["model"])
    else:
        for i, m in enumerate(chunks):
            m.load_state_dict(state[f"model{i}"])
    if "optimizer" in sd:
        tr.optimizer.load_state_dict(state["optimizer"])
        tr.scheduler.load_state_dict(state["scheduler"])
    # else Megatron-LM's no_load_optim: a fresh optimizer and LR schedule (warm-up again) from the loaded weights
    consumed = state["data"].get("consumed_samples")
    for i, it in enumerate(tr.iters):
        if consumed is None:  # written before positions were kept as samples: same layout assumed
            it.next_micro = int(state["data"]["next_micro"][i])
            continue
        row = it.mbs * it.dp
        if int(consumed[i]) % row:
            raise ValueError(f"the checkpoint consumed {consumed[i]} samples, not a whole number of rows of "
                             f"micro_batch_size x dp = {row}: the data position cannot be resumed at this layout")
        it.next_micro = int(consumed[i]) // row
    rf = _rng_tracker_file(path, torch.distributed.get_rank())
    if os.path.isfile(rf) and not tr.cfg.checkpoint.no_load_rng:
        try:
            tensor_parallel.get_cuda_rng_tracker().set_states(torch.load(rf, weights_only=True))
        except Exception:  # noqa: BLE001 - trackers differ between platforms; torch RNGs are restored anyway
            pass
    return {"next_micro": [it.next_micro for it in tr.iters]}


class NonFiniteGuard:
    """on_nonfinite=skip for megatron: after the optimizer's own prepare_grads (grads copied to main grads,
    unscaled), a non-finite global grad norm counts as 'found inf', so optimizer.step() returns (False, None, None)
    and updates nothing. The norm is kept in `last_norm` for the log. One extra grad-norm reduction, skip mode only."""

    def __init__(self, optimizer):
        self.opt = optimizer
        self.last_norm: Optional[float] = None
        inner = optimizer.prepare_grads

        def prepare_grads() -> bool:
            found_inf = inner()
            self.last_norm = None
            if found_inf:
                return True
            norm = float(optimizer.get_grad_norm())
            self.last_norm = norm
            return not math.isfinite(norm)

        optimizer.prepare_grads = prepare_grads


def nonfinite_guard(tr) -> Optional[NonFiniteGuard]:
    return NonFiniteGuard(tr.optimizer) if tr.cfg.training.on_nonfinite.value == "skip" else None


def reshard_problem(cfg, saved: Dict[str, Any], now: Dict[str, Any]) -> Optional[str]:
    """None: megatron.core.dist_checkpointing reshards every layout change (tp, pp, vpp, ep, dp, world size): the
    model's and the optimizer's sharded tensors are keyed by global name and offset (the distributed optimizer's
    default `fully_sharded_model_space` format included), and the data position is kept as samples consumed."""
    return None
