"""TorchTitan checkpoints through torch.distributed.checkpoint (DCP), with TorchTitan's own Stateful objects.

TorchTitan's CheckpointManager stays disabled (`checkpoint.enable=false` in the job TOML): its folder layout,
interval and keep-latest logic would compete with primus/checkpoint.py (atomic rename, crc32, resume=auto). What it
does build is still used: `trainer.checkpointer.states` holds exactly what TorchTitan checkpoints (train_state =
step + tokens seen, model via ModelWrapper, optimizers, lr_schedulers, dataloader). We save that dict, with the
model flattened to the top level as TorchTitan does, with `dcp.save` into `<tmp>/dcp/`, and load it with `dcp.load`
(resharding across world sizes and parallelisms comes with DCP).

Also here: the non-finite guard for `training.on_nonfinite=skip` (the optimizer and LR scheduler do not step when
the clipped gradients hold NaN/inf), and the NaN test hook (primus/fault_injection.py).
"""
from __future__ import annotations

import math
import os
from typing import Any, Dict, Optional

DCP_DIR = "dcp"


# TorchTitan's states that hold the optimizer and its LR schedule (checkpoint.no_save_optim / no_load_optim leave
# them out, as TorchTitan's own checkpoint.exclude_from_loading does on loading)
OPTIM_STATES = ("optimizer", "lr_scheduler")


def _states(tt, with_optim: bool = True) -> Dict[str, Any]:
    """TorchTitan's checkpoint states, model flattened (CheckpointManager._flattened_model_states_sd)."""
    states = tt.checkpointer.states
    sd = {k: v for k, v in states.items() if k != "model" and (with_optim or k not in OPTIM_STATES)}
    sd.update(states["model"].state_dict())
    return sd


def save(tt, path: str, step: int, with_optim: bool = True) -> Dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    assert tt.step == step, f"torchtitan trainer is at step {tt.step}, saving step {step}"
    dcp.save(_states(tt, with_optim), checkpoint_id=os.path.join(path, DCP_DIR))
    return {"step": tt.step, "ntokens_seen": int(tt.ntokens_seen)}


def load(tt, path: str, saved_layout: Optional[Dict[str, Any]] = None, with_optim: bool = True) -> Dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    sd = _states(tt, with_optim)
    dp_now = tt.parallel_dims.dp_replicate * tt.parallel_dims.dp_shard
    moved = saved_layout is not None and _dp(saved_layout) != dp_now
    if moved:
        # one data-loader state per saved dp rank (keys dp_rank_<r>): this run's ranks have none to read
        # (reshard_problem refused every data kind but the synthetic stream before we got here)
        sd.pop("dataloader", None)
    dcp.load(sd, checkpoint_id=os.path.join(path, DCP_DIR))
    # the model entries were loaded in place into a flattened copy: hand them to the model (as TorchTitan does)
    tt.checkpointer.states["model"].load_state_dict(sd)
    if moved:
        # sample i goes to dp rank i mod dp: after `step` steps of the global batch every rank is at the same index
        per_rank = tt.job_config.training.local_batch_size * tt.gradient_accumulation_steps
        tt.dataloader.dataset.load_state_dict({"next": tt.step * per_rank})
    return {"step": tt.step, "ntokens_seen": int(tt.ntokens_seen)}


class NonFiniteGuard:
    """on_nonfinite=skip: wrap this trainer's optimizers.step / lr_schedulers.step (instance attributes, nothing
    global). TorchTitan's train_step clips before optimizers.step; clipping by a NaN norm makes every grad NaN, by an
    inf norm makes the inf entries NaN, so 'some clipped grad is non-finite' == 'the grad norm was non-finite'.
    The check is one foreach-norm over the local grads plus one all-reduce, only in skip mode."""

    def __init__(self, tt):
        self.tt = tt
        self.skipped = False
        self._opt_step = tt.optimizers.step
        self._lr_step = tt.lr_schedulers.step
        tt.optimizers.step = self._optimizer_step
        tt.lr_schedulers.step = self._scheduler_step

    def _grads_finite(self) -> bool:
        import torch
        import torch.distributed as dist

        grads = []
        for part in self.tt.model_parts:
            for p in part.parameters():
                if p.grad is not None:
                    g = p.grad
                    grads.append(g.to_local() if hasattr(g, "to_local") else g)
        bad = torch.zeros(1, dtype=torch.float32, device=self.tt.device)
        if grads:
            norms = torch._foreach_norm(grads)
            bad = (~torch.isfinite(torch.stack([n.float() for n in norms]))).any().float().reshape(1).to(bad.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        return not bool(bad.item())

    def _optimizer_step(self, *args, **kwargs):
        self.skipped = not self._grads_finite()
        if self.skipped:
            self.tt.optimizers.zero_grad()
            return None
        return self._opt_step(*args, **kwargs)

    def _scheduler_step(self, *args, **kwargs):
        if self.skipped:
            return None  # as megatron does for a skipped update: the schedule does not advance
        return self._lr_step(*args, **kwargs)


class NaNInjector:
    """TEST HOOK (PRIMUS_INJECT_NAN_AT_STEP): multiply the loss of one step by NaN through the trainer's loss_fn
    (non-PP runs: a PP schedule holds its own reference to the loss function)."""

    def __init__(self, tt):
        self.on = False
        inner = tt.loss_fn

        def loss_fn(*args, **kwargs):
            loss = inner(*args, **kwargs)
            return loss * math.nan if self.on else loss

        tt.loss_fn = loss_fn


def nonfinite_guard(tt, cfg) -> Optional[NonFiniteGuard]:
    return NonFiniteGuard(tt) if cfg.training.on_nonfinite.value == "skip" else None


def _dp(layout: Dict[str, Any]) -> int:
    return int(layout.get("dp") or 1)


def reshard_problem(cfg, saved: Dict[str, Any], now: Dict[str, Any]) -> Optional[str]:
    """DCP reshards model and optimizer across any world size and parallelism. The data position is per dp rank:
    TorchTitan 0.2.2's ParallelAwareDataloader keeps one state per dp rank and asserts the dp degree is unchanged
    ("dataloader resharding is not supported yet"). The synthetic stream is re-positioned from the step (sample i
    goes to rank i mod dp); a jsonl stream cannot be, so a dp change is refused before loading."""
    if _dp(saved) != _dp(now) and cfg.data.kind.value != "synthetic":
        return (f"the data position of data.kind={cfg.data.kind.value} is kept per data-parallel rank and "
                f"TorchTitan {_tt_version()} cannot reshard it from dp={_dp(saved)} to dp={_dp(now)}; resume with "
                f"dp={_dp(saved)} (tp/pp/cp may change), or start a new run")
    return None


def _tt_version() -> str:
    from primus.backends.torchtitan.jobconfig_keys import installed_version

    return installed_version() or "?"
