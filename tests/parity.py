"""The parity matrix (no tests here): which parallel layouts must train like one process, on which model, and how
close their loss curves must be. tests/test_parity_matrix.py runs it; docs/launching.md shows it with its results.

Every layout runs the same job as the one-process reference: same model, same global batch (4 sequences of 64
tokens), same samples per step, fp32 (precision.bf16=false: the bound below is fp32's), deterministic mode, 4 steps.

Tolerances:
- "exact": the loss curve is bitwise the reference's. Data parallelism with one micro batch per rank allows it:
  the reference accumulates the same two micro-batch gradients g1/2 + g2/2 that dp2's all-reduce (or the
  distributed optimizer's reduce-scatter) sums, and a sum of two floats does not depend on its order (dp4
  sums four: gloo's order need not be the reference's, so dp4 is held to the bound). Megatron's
  pipeline stages (with or without virtual stages) too: each layer runs the same kernels on the same micro batches
  and accumulates their gradients in the same order; only activations move between ranks.
- REL (1.2e-4, relative, per step): tensor, pipeline, sequence and expert parallelism split or reorder reductions
  (tp's partial-sum all-reduces, the vocab-parallel softmax, the experts' token order, FSDP's reduce-scatter), so the
  float results differ by rounding. Reassociating an n-term fp32 sum changes it by at most (n - 1) * u * sum|x_i|
  (u = 2^-24, unit roundoff); the longest reduction a layout splits here is the 2048-logit softmax normaliser, so
  one step's loss may move by 2048 * 2^-24 = 1.2e-4 of its value. Observed differences are about one ulp
  (5e-7 on a loss of 7.6); a real layout bug (a missing all-reduce, a wrong shard, double-counted micro batches)
  moves the loss by 1e-2 or more from the first step.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import List, Tuple

REL = 2048 * 2.0 ** -24

# one job for every layout and its reference
COMMON = ["device=cpu", "precision.bf16=false", "training.deterministic=true", "training.seq_length=64",
          "training.global_batch_size=4", "training.micro_batch_size=2", "training.train_iters=4",
          "training.lr_warmup_iters=0", "training.lr=3e-3"]
TORCHTITAN = ["backend=torchtitan", "precision.mixed_precision_param=float32"]


@dataclass(frozen=True)
class Layout:
    name: str
    backend: str
    nproc: int
    overrides: Tuple[str, ...]
    model: str = "debug"
    # micro batch size, the reference's too: MoE's load-balancing loss is computed per micro batch, so another
    # micro batch is another objective, not a rounding difference; at 4 ranks a global batch of 4 needs 1
    micro: int = 2
    exact: bool = False
    ci: bool = False  # in `make test`; the others carry the `scale` marker (`make test-scale`)
    refused: str = ""  # not run: validation refuses it before start, for this reason (the test checks it does)

    @property
    def tolerance(self) -> str:
        return "bitwise" if self.exact else f"rel {REL:.1e}"

    def args(self) -> List[str]:
        base = [*COMMON, *(TORCHTITAN if self.backend == "torchtitan" else []), f"model={self.model}",
                f"training.micro_batch_size={self.micro}"]
        return [*base, *self.overrides]

    def reference(self) -> List[str]:
        """The one-process run this layout is compared with: same model, same micro batches."""
        return Layout("one process", self.backend, 1, (), self.model, self.micro).args()


TP2 = "parallel.tensor_model_parallel_size=2"
PP2 = "parallel.pipeline_model_parallel_size=2"
SP = "parallel.sequence_parallel=true"

MATRIX: List[Layout] = [
    Layout("dp2", "megatron", 2, (), exact=True, ci=True),
    Layout("dp2 + distributed optimizer", "megatron", 2, ("memory=distributed_optimizer",), exact=True, ci=True),
    Layout("tp2", "megatron", 2, (TP2,)),
    Layout("tp2 + sp", "megatron", 2, (TP2, SP), ci=True),
    Layout("pp2", "megatron", 2, (PP2,), exact=True),
    Layout("pp2 + vpp2", "megatron", 2, (PP2, "parallel.virtual_pipeline_model_parallel_size=2"), exact=True,
           ci=True),
    Layout("ep2", "megatron", 2, ("parallel.expert_model_parallel_size=2",), model="debug_moe", ci=True),
    Layout("cp2", "megatron", 2, ("parallel.context_parallel_size=2",),
           refused="megatron-core's context parallelism is Transformer Engine's attention (ring exchange inside "
                   "TEDotProductAttention); the local SDPA spec has none (and with TE this backend does not yet split "
                   "each sequence's data and loss over cp), so validation refuses cp > 1"),
    # uneven stages (decoder_first/last_pipeline_num_layers): 1 + 3 of the debug model's 4 layers
    Layout("pp2, 1 + 3 layers", "megatron", 2, (PP2, "parallel.decoder_first_pipeline_num_layers=1"), exact=True),
    Layout("tp2 + pp2", "megatron", 4, (TP2, PP2)),
    # ep is carved out of dp: at 2 ranks ep2 has dense dp2 and one expert replica; 4 ranks give each expert 2 replicas
    Layout("ep2 + dp2 (expert dp2, dense dp4)", "megatron", 4, ("parallel.expert_model_parallel_size=2",),
           model="debug_moe", micro=1),
    Layout("dp4", "megatron", 4, (), micro=1),
    Layout("FSDP2 (dp_shard 2)", "torchtitan", 2, ()),
    Layout("tp2", "torchtitan", 2, (TP2, SP)),
    Layout("cp2", "torchtitan", 2, ("parallel.context_parallel_size=2",),
           refused="torch's context_parallel() shards the CUDA attention kernels only: on CPU the first step fails "
                   "in DTensor dispatch (aten._scaled_dot_product_flash_attention_for_cpu has no sharding "
                   "strategy), so validation refuses cp > 1 on CPU"),
    Layout("pp2", "torchtitan", 2, (PP2,)),
    Layout("pp2, 3 + 1 layers", "torchtitan", 2, (PP2, "parallel.decoder_last_pipeline_num_layers=1")),
    Layout("HSDP 2x2", "torchtitan", 4, ("parallel.data_parallel_replicate_degree=2",
                                          "parallel.data_parallel_shard_degree=2"), micro=1),
]


def set_same_weights(model) -> None:
    """Give every parameter a value that depends only on its name and global shape, so runs with different
    sharding start from the same model: TorchTitan draws each shard from the local CPU generator (DTensor's
    layout-independent RNG exists for CUDA-like devices only), so each FSDP rank would otherwise draw its own."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    with torch.no_grad():
        for name, p in model.named_parameters():
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            full = 1.0 + 0.02 * torch.randn(p.shape, generator=g) if p.dim() == 1 else \
                0.05 * torch.randn(p.shape, generator=g)
            if isinstance(p, DTensor):
                full = distribute_tensor(full, p.device_mesh, p.placements)
            p.copy_(full.to(p.dtype))
