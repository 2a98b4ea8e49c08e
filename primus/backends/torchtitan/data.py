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

from primus.features.data import (
    EVAL_SPLIT, JSONL_DATASET, JSONL_HELDOUT_DATASET, JSONL_TRAIN_DATASET, SYNTHETIC_DATASET,
)

# synthetic validation samples: indices past what a training run reads (a billion samples); below 2^32, since the
# CPU generator that makes each sample keeps 32 bits of its seed
HELDOUT_FIRST_INDEX = 1 << 30


class SyntheticTokens(IterableDataset, Stateful):
    """Sequences stitched from a fixed bank of random n-grams, so a model can learn them and the loss visibly falls.

    Sample i depends only on (seed, i), and dp rank r reads samples r, r + dp, r + 2 dp, ...: a step's global batch
    is the same set of samples whatever the dp degree, so a 2-rank run can be compared with a 1-rank run.
    """

    def __init__(self, vocab_size: int, seq_len: int, seed: int, dp_rank: int = 0, dp_world_size: int = 1,
                 num_patterns: int = 64, pattern_len: int = 16, first_index: int = 0, restart: bool = False):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        # held-out data: the same n-gram bank (the same distribution), samples from a range training never reads;
        # restart=True reads them from the start on every pass, so each evaluation sees the same batches
        self.first_index, self.restart = first_index, restart
        g = torch.Generator().manual_seed(seed)
        self.bank = torch.randint(0, vocab_size, (num_patterns, pattern_len), generator=g)
        self._next = 0  # samples this rank has yielded

    def sample(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        n = (self.seq_len + 1 + self.bank.shape[1] - 1) // self.bank.shape[1]
        picks = torch.randint(0, self.bank.shape[0], (n,), generator=g)
        return self.bank[picks].reshape(-1)[: self.seq_len + 1]

    def __iter__(self):
        if self.restart:
            self._next = 0
        while True:
            x = self.sample(self.first_index + self.dp_rank + self._next * self.dp_world_size)
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


_TRAIN_PERCENT = int(EVAL_SPLIT.split(",")[0])


def _cut(ds) -> int:
    return len(ds) * _TRAIN_PERCENT // 100


def _load_jsonl_train(path: str):
    ds = _load_jsonl(path)
    return ds.select(range(_cut(ds)))


def _load_jsonl_heldout(path: str):
    ds = _load_jsonl(path)
    return ds.select(range(_cut(ds), len(ds)))


def register_jsonl_dataset() -> None:
    """Add `primus_jsonl` (a local jsonl file or folder, `text` field) to TorchTitan's dataset table, and its
    training / held-out shares (EVAL_SPLIT) used when evaluating."""
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS

    for name, loader in ((JSONL_DATASET, _load_jsonl), (JSONL_TRAIN_DATASET, _load_jsonl_train),
                         (JSONL_HELDOUT_DATASET, _load_jsonl_heldout)):
        DATASETS.setdefault(name, DatasetConfig(path="", loader=loader, sample_processor=lambda sample: sample["text"]))


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


# ------------------------------------------------------------------------------------------- eod masking

EOD_MASK: Dict[str, Any] = {"eod": None}  # data.eod_mask_loss: the end-of-document id masked out of the loss


def configure(eod_id) -> None:
    """Set before TorchTitan builds its trainer: the id whose label is left out of the loss, or None."""
    EOD_MASK["eod"] = eod_id


def mask_eod(labels: torch.Tensor) -> torch.Tensor:
    """Labels equal to the end-of-document id become TorchTitan's IGNORE_INDEX: its loss sums the rest and divides
    by the count of labels that are not ignored (train and validation alike)."""
    eod = EOD_MASK["eod"]
    if eod is None:
        return labels
    from torchtitan.components.loss import IGNORE_INDEX

    return labels.masked_fill(labels == eod, IGNORE_INDEX)


def masked_batches(batches):
    """TorchTitan's batch generator, its labels eod-masked (data.eod_mask_loss)."""
    for input_dict, labels in batches:
        yield input_dict, mask_eod(labels)


# ------------------------------------------------------------------------------------------- validation


def _synthetic_validation_dataloader(job_config, dp_world_size, dp_rank, tokenizer, infinite=True):
    from torchtitan.components.dataloader import ParallelAwareDataloader
    from torchtitan.protocols.train_spec import get_train_spec

    v = job_config.validation
    vocab = get_train_spec(job_config.model.name).model_args[job_config.model.flavor].vocab_size
    ds = SyntheticTokens(vocab, v.seq_len, job_config.debug.seed or 0, dp_rank, dp_world_size,
                         first_index=HELDOUT_FIRST_INDEX, restart=True)
    return ParallelAwareDataloader(ds, dp_rank=dp_rank, dp_world_size=dp_world_size,
                                   **{**dataclasses.asdict(v.dataloader), "batch_size": v.local_batch_size})


def build_validator(**kw):
    """TrainSpec.build_validator_fn: TorchTitan's own Validator (its eval loop, loss and reduction), reading the
    held-out data: synthetic samples training never reads, or the held-out share of the jsonl file; labels
    eod-masked like training's."""
    import unittest.mock

    import torchtitan.components.validate as tv

    class PrimusValidator(tv.Validator):
        def post_dataloading_process(self, input_dict, labels, model_parts):
            return super().post_dataloading_process(input_dict, mask_eod(labels), model_parts)

    if kw["job_config"].validation.dataset == SYNTHETIC_DATASET:
        # Validator.__init__ builds TorchTitan's text dataloader by this module-level name
        with unittest.mock.patch.object(tv, "build_text_validation_dataloader", _synthetic_validation_dataloader):
            return PrimusValidator(**kw)
    register_jsonl_dataset()
    return PrimusValidator(**kw)
