"""Offline data for TorchTitan: a learnable synthetic token stream, and local jsonl (or plain text) with a local
tokenizer.

Both plug into TorchTitan's own hooks: the synthetic stream is what our train specs' `build_dataloader_fn`
returns for dataset `primus_synthetic`; jsonl is one more entry (`primus_jsonl`) in TorchTitan's dataset table,
loaded by its HuggingFaceTextDataset (tokenised by `tokenizer.json` from `model.hf_assets_path`). Nothing is
fetched from a hub.
"""
from __future__ import annotations

import dataclasses
import glob
import os
from typing import Any, Dict

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset

from primus.features.data import JSONL_DATASET, SYNTHETIC_DATASET


class SyntheticTokens(IterableDataset, Stateful):
    """Sequences stitched from a fixed bank of random n-grams, so a model can learn them and the loss visibly falls.

    Sample i depends only on (seed, i), and dp rank r reads samples r, r + dp, r + 2 dp, ...: a step's global batch
    is the same set of samples whatever the dp degree, so a 2-rank run can be compared with a 1-rank run.
    """

    def __init__(self, vocab_size: int, seq_len: int, seed: int, dp_rank: int = 0, dp_world_size: int = 1,
                 num_patterns: int = 64, pattern_len: int = 16):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        g = torch.Generator().manual_seed(seed)
        self.bank = torch.randint(0, vocab_size, (num_patterns, pattern_len), generator=g)
        self._next = 0  # samples this rank has yielded

    def sample(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        n = (self.seq_len + 1 + self.bank.shape[1] - 1) // self.bank.shape[1]
        picks = torch.randint(0, self.bank.shape[0], (n,), generator=g)
        return self.bank[picks].reshape(-1)[: self.seq_len + 1]

    def __iter__(self):
        while True:
            x = self.sample(self.dp_rank + self._next * self.dp_world_size)
            self._next += 1
            yield {"input": x[:-1]}, x[1:]

    def state_dict(self) -> Dict[str, Any]:
        return {"next": self._next}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._next = state_dict["next"]


def _jsonl_files(path: str):
    if os.path.isfile(path):
        return [path]
    files = sorted(glob.glob(os.path.join(path, "*.jsonl")) + glob.glob(os.path.join(path, "*.json")))
    if not files:
        raise FileNotFoundError(f"data.path {path}: no *.jsonl / *.json files")
    return files


def _load_jsonl(path: str):
    from datasets import load_dataset

    files = _jsonl_files(path)
    if not files[0].endswith((".jsonl", ".json")):
        # plain text: one document per line, as primus.data.megatron_preprocess reads it
        return load_dataset("text", data_files=files, split="train").filter(lambda s: bool(s["text"].strip()))
    return load_dataset("json", data_files=files, split="train")


def register_jsonl_dataset() -> None:
    """Add `primus_jsonl` (a local jsonl file or folder, `text` field) to TorchTitan's dataset table."""
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS

    DATASETS.setdefault(JSONL_DATASET, DatasetConfig(path="", loader=_load_jsonl,
                                                     sample_processor=lambda sample: sample["text"]))


def build_dataloader(dp_world_size: int, dp_rank: int, tokenizer, job_config, infinite: bool = True):
    """TrainSpec.build_dataloader_fn: synthetic tokens, or TorchTitan's own text dataloader for jsonl."""
    from torchtitan.components.dataloader import ParallelAwareDataloader
    from torchtitan.hf_datasets.text_datasets import build_text_dataloader
    from torchtitan.protocols.train_spec import get_train_spec

    tr = job_config.training
    if tr.dataset != SYNTHETIC_DATASET:
        register_jsonl_dataset()
        return build_text_dataloader(dp_world_size, dp_rank, tokenizer, job_config, infinite=infinite)
    vocab = get_train_spec(job_config.model.name).model_args[job_config.model.flavor].vocab_size
    ds = SyntheticTokens(vocab, tr.seq_len, job_config.debug.seed or 0, dp_rank, dp_world_size)
    return ParallelAwareDataloader(ds, dp_rank=dp_rank, dp_world_size=dp_world_size,
                                   **{**dataclasses.asdict(tr.dataloader), "batch_size": tr.local_batch_size})


def build_tokenizer(job_config):
    """TrainSpec.build_tokenizer_fn: none for synthetic tokens, else the local HF tokenizer folder."""
    if job_config.training.dataset == SYNTHETIC_DATASET:
        return None
    from torchtitan.components.tokenizer import build_hf_tokenizer

    return build_hf_tokenizer(job_config)
