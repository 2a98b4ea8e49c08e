"""Collectives the project itself calls (the backends call their own)."""
from __future__ import annotations


def barrier() -> None:
    """Wait for every rank of the default group; a no-op outside torch.distributed.

    With NCCL it names this rank's GPU: a group initialised without device_id (TorchTitan's; megatron's passes it)
    otherwise makes torch guess the device from the current context and warn at every call that the guess may be
    wrong (a hang when it is). Gloo takes no device ids."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if "nccl" in str(dist.get_backend()):
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()
