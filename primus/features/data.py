"""The data feature: synthetic tokens, a megatron indexed dataset or local jsonl text (see
primus/features/__init__.py). The loaders are primus/data/ and each backend's data.py."""
from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from typing import Optional

from primus.config.errors import ConfigIssue
from primus.features import rule


class DataKind(str, Enum):
    synthetic = "synthetic"  # random tokens (megatron: MockGPTDataset; torchtitan: in-memory tokens)
    indexed = "indexed"  # megatron-core .bin/.idx prefix
    jsonl = "jsonl"  # a local folder/file of jsonl with a `text` field, tokenised by a local tokenizer


@dataclass
class DataConfig:
    kind: DataKind = DataKind.synthetic
    path: Optional[str] = None  # indexed prefix (no .bin/.idx) or jsonl file/folder
    tokenizer: Optional[str] = None  # local tokenizer folder (tokenizer.json) for jsonl data
    num_workers: int = 0  # dataloader workers
    # leave the end-of-document token out of the loss (the token predicted after it belongs to another document);
    # synthetic data's end-of-document id is vocab_size - 1 (megatron's null tokenizer), else the tokenizer's
    eod_mask_loss: bool = False


# With evaluation on (training.eval_interval), the held-out split: megatron's dataset split (train, valid, test
# percentages) and TorchTitan's jsonl split; synthetic data on TorchTitan holds out a disjoint range of samples.
EVAL_SPLIT = "98,2,0"


@rule
def data_paths(cfg, ctx):
    d, out = cfg.data, []
    kind = d.kind.value
    if kind == "synthetic":
        return []
    if not d.path:
        return [ConfigIssue(["data.path"], d.path, f"data.kind={kind} reads a local path", "set data.path")]
    if kind == "indexed":
        missing = [p for p in (d.path + ".bin", d.path + ".idx") if not os.path.isfile(p)]
        if missing:
            out.append(ConfigIssue(["data.path"], d.path, f"indexed dataset files not found: {missing}",
                                   "give the prefix without .bin/.idx (build one with python -m primus.data.megatron_preprocess)"))
    elif not os.path.exists(d.path):
        out.append(ConfigIssue(["data.path"], d.path, "does not exist", "point data.path at a local jsonl file or folder"))
    if kind in ("jsonl", "indexed") and d.tokenizer and not os.path.isfile(os.path.join(d.tokenizer, "tokenizer.json")):
        out.append(ConfigIssue(["data.tokenizer"], d.tokenizer, "no tokenizer.json in that folder",
                               "point data.tokenizer at a local tokenizer folder"))
    if kind == "jsonl" and not d.tokenizer:
        out.append(ConfigIssue(["data.tokenizer"], None, "jsonl text needs a local tokenizer", "set data.tokenizer"))
    return out


def evaluating(cfg) -> bool:
    return bool(cfg.training.eval_interval and cfg.training.eval_iters)


def megatron(cfg, ctx) -> dict:
    d, t = cfg.data, cfg.training
    ev = evaluating(cfg)
    return {"data": {"kind": d.kind.value, "path": d.path, "tokenizer": d.tokenizer, "seed": t.seed,
                     "num_samples": t.train_iters * t.global_batch_size, "eod_mask_loss": d.eod_mask_loss,
                     "split": EVAL_SPLIT if ev else "100,0,0",
                     "valid_samples": t.eval_iters * t.global_batch_size if ev else 0}}


# TorchTitan dataset names primus/backends/torchtitan/data.py registers in TorchTitan's dataset table: the jsonl
# file whole, or its first EVAL_SPLIT share (training) and the rest (validation) when evaluating
SYNTHETIC_DATASET = "primus_synthetic"
JSONL_DATASET = "primus_jsonl"
JSONL_TRAIN_DATASET = "primus_jsonl_train"
JSONL_HELDOUT_DATASET = "primus_jsonl_heldout"


def torchtitan(cfg, ctx) -> dict:
    d = cfg.data
    ev = evaluating(cfg)
    jsonl = JSONL_TRAIN_DATASET if ev else JSONL_DATASET
    training = {"dataset": SYNTHETIC_DATASET if d.kind == DataKind.synthetic else jsonl,
                "dataloader": {"num_workers": d.num_workers}}
    if d.kind == DataKind.jsonl and d.path:
        training["dataset_path"] = os.path.abspath(d.path)
    out = {"training": training}
    if ev:
        out["validation"] = {"dataset": SYNTHETIC_DATASET if d.kind == DataKind.synthetic else JSONL_HELDOUT_DATASET}
        if d.kind == DataKind.jsonl and d.path:
            out["validation"]["dataset_path"] = os.path.abspath(d.path)
    if d.kind == DataKind.jsonl and d.tokenizer:
        out["model"] = {"hf_assets_path": os.path.abspath(d.tokenizer)}
    return out


def torchtitan_issues(cfg, ctx) -> list:
    if cfg.data.kind == DataKind.indexed:
        return [ConfigIssue(["data.kind"], "indexed", "torchtitan reads text datasets, not megatron .bin/.idx",
                            "use data=jsonl or synthetic")]
    return []
