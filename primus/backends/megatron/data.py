"""Training data through megatron-core's dataset builder: MockGPTDataset (synthetic, offline) or a local indexed
dataset prefix (.bin/.idx). A jsonl source is first turned into an indexed dataset in the run dir by
primus.data.megatron_preprocess (rank 0 writes, the others wait).

Sample order is Megatron-LM's: global batch g holds samples [g*G, (g+1)*G); within it, micro batch j of dp rank r
is the slice [j*mbs*dp + r*mbs, ... + mbs). A layout change (dp=1 with more micro batches vs dp=2) therefore sees
the same samples in each optimizer step.
"""
from __future__ import annotations

import os
from typing import Dict, Iterator, List

import torch

from primus.launch.dist import barrier


def _null_tokenizer(vocab_size: int):
    from megatron.core.tokenizers import MegatronTokenizer

    # the null tokenizer appends its end-of-document id after `vocab_size` ids
    return MegatronTokenizer.from_pretrained(metadata_path={"library": "null"}, vocab_size=vocab_size - 1)


PAD_CANDIDATES = ("<|pad|>", "<pad>", "[PAD]", "<|finetune_right_pad_id|>")


class _HFTokenizerForMegatron:
    """What megatron's GPTDataset needs from a tokenizer (eod, pad, vocab size, an identity), over a local
    tokenizers.Tokenizer."""

    def __init__(self, folder: str):
        from tokenizers import Tokenizer

        from primus.data.megatron_preprocess import eod_id

        self._tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        self.folder = folder
        self.eod = eod_id(self._tok)
        self.vocab_size = self._tok.get_vocab_size()
        self.unique_identifiers = {"class": "primus-hf-tokenizer", "path": os.path.abspath(folder)}
        pads = [i for i in (self._tok.token_to_id(t) for t in PAD_CANDIDATES) if i is not None]
        # GPTDataset masks the loss where labels == pad. Without a pad token of its own, an id no token has
        # (megatron's own fallback, -1): the eod as pad would mask every document end and megatron warns so.
        self.pad = pads[0] if pads else -1


def _ensure_indexed(cfg, ctx, tokenizer_dir: str) -> str:
    """data.path as an indexed prefix; a jsonl source is converted once into the run dir."""
    d = cfg.data
    if d.kind.value == "indexed":
        return d.path
    prefix = os.path.join(ctx.run_dir, "data", "megatron_indexed")
    if ctx.rank == 0 and not os.path.exists(prefix + ".idx"):
        from primus.data.megatron_preprocess import preprocess

        preprocess(d.path, tokenizer_dir, prefix)
    barrier()
    return prefix


def build_dataset(cfg, ctx, args: Dict, cache_dir: str):
    """The training split; build_datasets gives the held-out one too."""
    return build_datasets(cfg, ctx, args, cache_dir)[0]


def build_datasets(cfg, ctx, args: Dict, cache_dir: str):
    """(train, validation): megatron's split of one source (data.EVAL_SPLIT when evaluating); validation is None
    without evaluation."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset

    d = args["data"]
    common = dict(
        random_seed=d["seed"],
        sequence_length=cfg.training.seq_length,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=d["eod_mask_loss"],
        create_attention_mask=False,  # causal attention builds its own mask (SDPA is_causal / TE)
        split=d["split"],
    )
    if d["kind"] == "synthetic":
        config = GPTDatasetConfig(tokenizer=_null_tokenizer(cfg.model.vocab_size), **common)
        cls = MockGPTDataset
    else:
        # the tokenizer folder the data feature resolved (the built-in byte-level one for jsonl by default)
        prefix = _ensure_indexed(cfg, ctx, d["tokenizer"])
        tokenizer = _HFTokenizerForMegatron(d["tokenizer"]) if d["tokenizer"] else None
        if tokenizer is not None and tokenizer.vocab_size > cfg.model.vocab_size:
            raise ValueError(f"data.tokenizer has {tokenizer.vocab_size} tokens, more than model.vocab_size "
                             f"({cfg.model.vocab_size}): raise model.vocab_size")
        config = GPTDatasetConfig(tokenizer=tokenizer, blend=([prefix], None), path_to_cache=cache_dir, **common)
        cls = GPTDataset
    sizes = [d["num_samples"], d["valid_samples"], 0]
    train, valid, _ = BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, config).build()
    return train, (valid if d["valid_samples"] else None)


def _stack(samples) -> Dict[str, torch.Tensor]:
    return {k: torch.stack([torch.as_tensor(s[k]) for s in samples]) for k in
            ("tokens", "labels", "loss_mask", "position_ids")}


class _Rows:
    """DataLoader batch sampler: this dp rank's micro batches from row `start` on, without end."""

    def __init__(self, it: "MicroBatches", start: int):
        self.it, self.start = it, start

    def __iter__(self):
        row = self.start
        while True:
            yield self.it.indices(row)
            row += 1


class MicroBatches:
    """Iterator over this dp rank's micro batches, in Megatron-LM's sample order (see module doc). With
    data.num_workers > 0 the samples are read and stacked in that many DataLoader worker processes (Megatron-LM's
    --num-workers), in pinned memory on a GPU; the batches and their order are the same as without."""

    def __init__(self, dataset, micro_batch_size: int, dp_rank: int, dp_size: int, device: str,
                 num_workers: int = 0):
        self.ds, self.mbs, self.r, self.dp, self.device = dataset, micro_batch_size, dp_rank, dp_size, device
        self.num_workers = num_workers
        self.next_micro = 0  # micro batches consumed (across all dp ranks: one "row" of mbs*dp samples each)
        self._loader, self._loader_next = None, None  # the workers' iterator and the row it yields next

    def __iter__(self) -> Iterator:
        return self

    def indices(self, row: int) -> List[int]:
        start = row * self.mbs * self.dp + self.r * self.mbs
        return [i % len(self.ds) for i in range(start, start + self.mbs)]

    def _from_workers(self) -> Dict[str, torch.Tensor]:
        if self._loader is None or self._loader_next != self.next_micro:  # first batch, or a resume moved it
            self._loader = iter(torch.utils.data.DataLoader(
                self.ds, batch_sampler=_Rows(self, self.next_micro), num_workers=self.num_workers,
                collate_fn=_stack, pin_memory=self.device != "cpu"))
        batch = next(self._loader)
        self._loader_next = self.next_micro + 1
        return batch

    def __next__(self) -> Dict[str, torch.Tensor]:
        if self.num_workers > 0:
            batch = self._from_workers()
        else:
            batch = _stack([self.ds[i] for i in self.indices(self.next_micro)])
        self.next_micro += 1
        if self.device != "cpu":
            batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        return batch
