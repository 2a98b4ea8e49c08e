"""TorchTitan backend: runs TorchTitan's own trainer, configured from the validated Primus config.

Pinned to torchtitan 0.2.2. 0.3.0 does not import on torch 2.11 (the GPU machine: `DataParallelMeshDims` is
missing from torch.distributed.fsdp) and on torch 2.13 it needs patches (it calls `torch.distributed.set_timeout`
and assumes newer FSDP internals; its default FlexAttention has no CPU backward). 0.2.2 trains stock on torch 2.11
and, with the redirections in `patches/cpu.py`, on CPU with torch 2.13. It imports triton without declaring it.

Modules: `args` (config -> TorchTitan job config dict, no torch import), `jobconfig_keys` (checks those keys
against the installed TorchTitan), `flavors` (our ModelConfig -> a TorchTitan model family + flavor args),
`spec` (registers our train specs / flavors in TorchTitan's registry), `data` (offline datasets),
`patches` (upstream workarounds, registered with their pinned versions: the CPU-only redirections), `trainer`
(drives `torchtitan.train.Trainer` step by step).
"""

PINNED_VERSION = "0.2.2"
