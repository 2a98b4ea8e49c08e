"""Collectives the project itself calls (the backends call their own)."""
from __future__ import annotations


def barrier() -> None:
    """Wait for every rank of the default group; a no-op outside torch.distributed.

    With NCCL it names this rank's GPU: torch otherwise guesses the device from the current context and warns
    at every call that the guess may be wrong (a hang when it is), since init_process_group gets no device_id here.
    Gloo takes no device ids."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if "nccl" in str(dist.get_backend()):
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()
