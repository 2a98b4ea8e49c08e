"""Weight init that does not depend on the parallel layout.

megatron-core draws each rank's shard from a generator whose state depends on tp rank, pipeline stage and build
order, so the same seed gives different models under tp=2, pp=2 or dp=2. Here every parameter is drawn whole
from a generator seeded by (seed, its global name) and this rank keeps its shard, cut the way megatron cuts it
(partition_dim, partition_stride). Same seed -> same model whatever the layout: a 2-process run can be checked
against a 1-process one step by step. Parameters whose layout is not a plain cut (legacy GroupedMLP's fused
expert weights) keep megatron's own init and are listed in the return value.
"""
from __future__ import annotations

import math
import re
import zlib
from typing import List

import torch

_LAYER = re.compile(r"^(decoder\.layers\.)(\d+)(\..*)$")
_EXPERT = re.compile(r"^(.*\.local_experts\.)(\d+)(\..*)$")


def _global_name(model, name: str, expert_offset: int) -> str:
    """The parameter's name in the unsplit model: global layer and expert numbers, the tied output weight named
    after the embedding it copies."""
    m = _LAYER.match(name)
    if m:
        layer = model.decoder.layers[int(m.group(2))]
        name = f"{m.group(1)}{layer.layer_number - 1}{m.group(3)}"  # layer_number is global and 1-based
    m = _EXPERT.match(name)
    if m:
        name = f"{m.group(1)}{int(m.group(2)) + expert_offset}{m.group(3)}"
    if name == "output_layer.weight" and getattr(model, "share_embeddings_and_output_weights", False):
        name = "embedding.word_embeddings.weight"
    return name


def _std_for(name: str, config) -> float:
    # megatron: output projections of attention and MLP use std / sqrt(2 * num_layers)
    if name.endswith("linear_proj.weight") or name.endswith("linear_fc2.weight"):
        return config.init_method_std / math.sqrt(2.0 * config.num_layers)
    return config.init_method_std


def _shard(full: torch.Tensor, param: torch.nn.Parameter, rank: int, world: int) -> torch.Tensor:
    dim = param.partition_dim
    stride = getattr(param, "partition_stride", 1)
    piece = full.shape[dim] // (world * stride)
    chunks = torch.split(full, piece, dim=dim)
    return torch.cat(chunks[rank::world], dim=dim)


@torch.no_grad()
def layout_independent_init(model, config, seed: int) -> List[str]:
    """Re-initialise `model` (one GPTModel chunk, unwrapped, before the fp16/bf16 cast). Returns the names left
    with megatron's own init."""
    from megatron.core import parallel_state as ps

    tp_rank, tp_world = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    etp_rank, etp_world = ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size()
    num_experts = getattr(config, "num_moe_experts", None) or 0
    ep_world = ps.get_expert_model_parallel_world_size()
    expert_offset = ps.get_expert_model_parallel_rank() * (num_experts // ep_world) if num_experts else 0
    kept = []
    for name, p in model.named_parameters():
        gname = _global_name(model, name, expert_offset)
        is_expert = not getattr(p, "allreduce", True)
        if gname.endswith((".weight1", ".weight2")):  # GroupedMLP: experts fused into one strided matrix
            kept.append(name)
            continue
        if p.dim() == 1:
            # norms start at one, biases at zero (megatron's choice too)
            p.fill_(1.0 if "norm" in gname else 0.0)
            continue
        sharded = getattr(p, "tensor_model_parallel", False)
        rank, world = (etp_rank, etp_world) if is_expert else (tp_rank, tp_world)
        shape = list(p.shape)
        if sharded and world > 1:
            shape[p.partition_dim] *= world
        g = torch.Generator(device=p.device)
        g.manual_seed((seed * 1_000_003 + zlib.crc32(gname.encode())) % (2**63 - 1))
        full = torch.empty(shape, dtype=torch.float32, device=p.device).normal_(0.0, _std_for(gname, config),
                                                                                 generator=g)
        if sharded and world > 1:
            full = _shard(full, p, rank, world)
        p.copy_(full)
    return kept
