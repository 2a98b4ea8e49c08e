"""The data feature: synthetic tokens, a megatron indexed dataset or local jsonl text (see
primus/features/__init__.py). The loaders are primus/data/ and each backend's data.py; docs/data.md for users."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from enum import Enum
from typing import Optional

from primus.config.errors import ConfigIssue
from primus.features import rule


class DataKind(str, Enum):
    synthetic = "synthetic"  # random tokens (megatron: MockGPTDataset; torchtitan: in-memory tokens)
    indexed = "indexed"  # megatron-core .bin/.idx prefix
    jsonl = "jsonl"  # a local folder/file of jsonl with a `text` field (or plain text), tokenised locally


@dataclass
class DataConfig:
    kind: DataKind = DataKind.synthetic
    path: Optional[str] = None  # indexed prefix (no .bin/.idx) or jsonl file/folder
    # `bytes` (the built-in byte-level tokenizer; jsonl's default), a tokenizer.json file or a local Hugging Face
    # tokenizer folder holding one
    tokenizer: Optional[str] = None
    # processes that read and stack the samples (megatron: Megatron-LM's --num-workers; torchtitan: its dataloader's)
    num_workers: int = 0
    # leave the end-of-document token out of the loss (the token predicted after it belongs to another document);
    # synthetic data's end-of-document id is vocab_size - 1 (megatron's null tokenizer), else the tokenizer's
    eod_mask_loss: bool = False


# With evaluation on (training.eval_interval), the held-out split: megatron's dataset split (train, valid, test
# percentages) and TorchTitan's jsonl split; synthetic data on TorchTitan holds out a disjoint range of samples.
EVAL_SPLIT = "98,2,0"


BYTES = "bytes"  # data.tokenizer naming the built-in byte-level tokenizer (primus/data/byte_tokenizer.py)


def tokenizer_dir(d: DataConfig) -> Optional[str]:
    """The folder holding the tokenizer.json this data reads, None where none is read (synthetic, or an indexed
    dataset without one). jsonl text with no tokenizer named gets the built-in byte-level one."""
    if d.kind == DataKind.synthetic:
        return None
    t = d.tokenizer
    if t == BYTES or (t is None and d.kind == DataKind.jsonl):
        from primus.data.byte_tokenizer import FOLDER

        return FOLDER
    if t is None:
        return None
    t = os.path.abspath(t)
    return os.path.dirname(t) if os.path.basename(t) == "tokenizer.json" else t


def tokenizer_vocab_size(tokenizer_json: str) -> int:
    """Ids a tokenizer.json can emit (model vocabulary plus added tokens), read as plain JSON: no tokenizer is
    built, so validation stays fast even for a 100k-token vocabulary."""
    with open(tokenizer_json, encoding="utf-8") as f:
        spec = json.load(f)
    vocab = (spec.get("model") or {}).get("vocab") or {}
    ids = list(vocab.values()) if isinstance(vocab, dict) else [len(vocab) - 1]  # Unigram: a list of pieces
    ids += [t["id"] for t in spec.get("added_tokens") or []]
    return max(ids) + 1 if ids else 0


@rule
def data_paths(cfg, ctx):
    d, out = cfg.data, []
    kind = d.kind.value
    if kind == "synthetic":
        extra = {k: v for k, v in (("data.path", d.path), ("data.tokenizer", d.tokenizer)) if v is not None}
        if extra:
            return [ConfigIssue(list(extra), extra, "synthetic data reads no file and no tokenizer",
                                "drop them, or choose data=jsonl (text) or data=indexed")]
        return []
    if not d.path:
        return [ConfigIssue(["data.path"], d.path, f"data.kind={kind} reads a local path", "set data.path")]
    if kind == "indexed":
        missing = [p for p in (d.path + ".bin", d.path + ".idx") if not os.path.isfile(p)]
        if missing:
            stem, ext = os.path.splitext(d.path)
            fix = (f"give the prefix without {ext}: data.path={stem}" if ext in (".bin", ".idx") else
                   "point data.path at the prefix of a .bin/.idx pair on this machine (python -m "
                   "primus.data.megatron_preprocess builds one from jsonl), or use data=synthetic")
            out.append(ConfigIssue(["data.path"], d.path, f"indexed dataset files not found: {missing}", fix))
    elif not os.path.exists(d.path):
        out.append(ConfigIssue(["data.path"], d.path, "does not exist", "point data.path at a local jsonl file or folder"))
    out += _tokenizer_issues(cfg)
    return out


def evaluating(cfg) -> bool:
    return bool(cfg.training.eval_interval and cfg.training.eval_iters)


def _tokenizer_issues(cfg) -> list:
    d = cfg.data
    folder = tokenizer_dir(d)
    if folder is None:
        return []
    if d.tokenizer not in (None, BYTES):
        if os.path.isfile(d.tokenizer) and os.path.basename(d.tokenizer) != "tokenizer.json":
            return [ConfigIssue(["data.tokenizer"], d.tokenizer, "a tokenizer file must be named tokenizer.json "
                                "(the backends read <folder>/tokenizer.json)",
                                "give the tokenizer.json file, or the folder holding it")]
        if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
            return [ConfigIssue(["data.tokenizer"], d.tokenizer, "no tokenizer.json there (a Hugging Face fast "
                                "tokenizer, as `tokenizer.save_pretrained()` writes it)",
                                f"point data.tokenizer at a local tokenizer.json or its folder, or use "
                                f"data.tokenizer={BYTES} (the built-in byte-level tokenizer)")]
    try:
        size = tokenizer_vocab_size(os.path.join(folder, "tokenizer.json"))
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [ConfigIssue(["data.tokenizer"], d.tokenizer, f"cannot read its tokenizer.json ({e})",
                            "point data.tokenizer at a valid tokenizer.json")]
    if size > cfg.model.vocab_size:
        # every id the tokenizer emits must have an embedding row (and a logit); the padding megatron adds to
        # the embedding is never a target
        return [ConfigIssue(["data.tokenizer", "model.vocab_size"], {"tokenizer_vocab": size,
                                                                     "model.vocab_size": cfg.model.vocab_size},
                            f"the tokenizer emits {size} ids, more than the model's vocabulary "
                            f"({cfg.model.vocab_size})",
                            f"set model.vocab_size={size} (or more), or use a tokenizer of at most "
                            f"{cfg.model.vocab_size} tokens")]
    return []


def megatron(cfg, ctx) -> dict:
    from primus.features.training import global_batch

    d, t = cfg.data, cfg.training
    ev = evaluating(cfg)
    return {"data": {"kind": d.kind.value, "path": d.path, "tokenizer": tokenizer_dir(d), "seed": t.seed,
                     "num_samples": t.train_iters * global_batch(cfg, ctx.world_size), "eod_mask_loss": d.eod_mask_loss,
                     "num_workers": d.num_workers,
                     "split": EVAL_SPLIT if ev else "100,0,0",
                     "valid_samples": t.eval_iters * global_batch(cfg, ctx.world_size) if ev else 0}}


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
    # TorchTitan reads its tokenizer from model.hf_assets_path. A synthetic run reads no tokenizer and no HF
    # weights: the run dir (which exists) keeps TorchTitan from warning that its default ./tests/assets/tokenizer
    # does not.
    folder = tokenizer_dir(d) if d.kind == DataKind.jsonl else None
    out["model"] = {"hf_assets_path": folder or os.path.abspath(ctx.run_dir)}
    return out


def torchtitan_issues(cfg, ctx) -> list:
    if cfg.data.kind == DataKind.indexed:
        return [ConfigIssue(["data.kind"], "indexed", "torchtitan reads text datasets, not megatron .bin/.idx",
                            "use data=jsonl or synthetic")]
    return []
