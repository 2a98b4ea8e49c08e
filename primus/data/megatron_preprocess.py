"""Local text or jsonl -> a megatron-core indexed dataset (.bin/.idx), tokenised with a local tokenizer.

    python -m primus.data.megatron_preprocess --input X.jsonl [--tokenizer DIR] --output-prefix P

Input: a .jsonl file (one document per line, text under --json-key, default "text"), a folder of .jsonl files, or
a plain text file (one document per non-empty line). The tokenizer is DIR/tokenizer.json, a tokenizer.json file, or
`bytes`, the built-in byte-level tokenizer (primus/data/byte_tokenizer.py; the default). The `tokenizers` library
reads it; nothing is downloaded. Each document gets the end-of-document token appended, as Megatron-LM's
preprocess_data.py does with --append-eod, so GPTDataset can pack documents into fixed-length samples.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Iterator, Optional

EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[EOS]", "<|eot_id|>")


def eod_id(tokenizer, token: Optional[str] = None) -> int:
    """The end-of-document id: the named token, else the first common EOS spelling the vocabulary has."""
    for cand in ([token] if token else EOD_CANDIDATES):
        i = tokenizer.token_to_id(cand)
        if i is not None:
            return i
    raise ValueError(f"the tokenizer has none of {list(EOD_CANDIDATES)}; name its end-of-document token with "
                     "--eod-token")


def tokenizer_file(tokenizer: str) -> str:
    """`bytes`, a tokenizer.json file or the folder holding one -> the tokenizer.json path."""
    if tokenizer == "bytes":
        from primus.data.byte_tokenizer import FOLDER

        tokenizer = FOLDER
    return tokenizer if os.path.isfile(tokenizer) else os.path.join(tokenizer, "tokenizer.json")


def documents(path: str, json_key: str = "text") -> Iterator[str]:
    files = sorted(glob.glob(os.path.join(path, "*.jsonl"))) if os.path.isdir(path) else [path]
    if not files:
        raise FileNotFoundError(f"no .jsonl files in {path}")
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                if f.endswith(".jsonl") or f.endswith(".json"):
                    try:
                        text = json.loads(line)[json_key]
                    except (json.JSONDecodeError, KeyError, TypeError) as e:
                        raise ValueError(f"{f}:{n}: expected a JSON object with a {json_key!r} field") from e
                else:
                    text = line
                if text:
                    yield text


def preprocess(input_path: str, tokenizer_dir: str, output_prefix: str, json_key: str = "text",
               eod_token: Optional[str] = None, batch: int = 1000) -> dict:
    import numpy as np
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file(tokenizer_dir))
    eod = eod_id(tok, eod_token)
    dtype = DType.optimal_dtype(tok.get_vocab_size())
    os.makedirs(os.path.dirname(os.path.abspath(output_prefix)), exist_ok=True)
    builder = IndexedDatasetBuilder(output_prefix + ".bin", dtype=dtype)
    docs = tokens = 0

    def flush(texts):
        nonlocal docs, tokens
        for enc in tok.encode_batch(texts, add_special_tokens=False):
            ids = enc.ids + [eod]
            builder.add_document(np.asarray(ids, dtype=dtype), [len(ids)])
            docs += 1
            tokens += len(ids)

    pending = []
    for text in documents(input_path, json_key):
        pending.append(text)
        if len(pending) >= batch:
            flush(pending)
            pending = []
    if pending:
        flush(pending)
    if docs == 0:
        raise ValueError(f"{input_path}: no documents")
    builder.finalize(output_prefix + ".idx")
    return {"documents": docs, "tokens": tokens, "eod": eod, "dtype": np.dtype(dtype).name,
            "vocab_size": tok.get_vocab_size()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", required=True, help="a .jsonl file, a folder of .jsonl files, or a text file")
    p.add_argument("--tokenizer", default="bytes",
                   help="tokenizer.json, the local folder holding it, or `bytes` (built-in byte-level; the default)")
    p.add_argument("--output-prefix", required=True, help="writes PREFIX.bin and PREFIX.idx")
    p.add_argument("--json-key", default="text")
    p.add_argument("--eod-token", default=None, help="end-of-document token (default: a common EOS spelling)")
    a = p.parse_args(argv)
    stats = preprocess(a.input, a.tokenizer, a.output_prefix, a.json_key, a.eod_token)
    print(json.dumps({"output_prefix": a.output_prefix, **stats}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
