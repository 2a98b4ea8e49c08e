"""The built-in byte-level tokenizer: one id per UTF-8 byte (0-255) plus three special tokens, so any text trains
with no tokenizer to build or download.

    ids 0..255   the byte itself (id == byte value: exact, lossless for any input)
    256          <|endoftext|>    end of document (EOS; megatron's EOD)
    257          <|begin_of_text|> beginning of document (BOS)
    258          <|pad|>          padding

It is a `tokenizers` BPE with the byte-level alphabet and no merges, saved as an ordinary tokenizer.json +
tokenizer_config.json folder (`FOLDER`, shipped with the package), so both backends read it as they read a user's
Hugging Face tokenizer. `python -m primus.data.byte_tokenizer` rewrites that folder from `build()`.
"""
from __future__ import annotations

import json
import os
import sys

NAME = "bytes"  # data.tokenizer=bytes names it; jsonl data without a tokenizer uses it
FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "byte_tokenizer")
EOS, BOS, PAD = "<|endoftext|>", "<|begin_of_text|>", "<|pad|>"
SPECIAL_TOKENS = (EOS, BOS, PAD)  # ids 256, 257, 258
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)


def _bytes_to_unicode() -> dict:
    """GPT-2's byte -> printable character table, which the `tokenizers` ByteLevel pre-tokenizer uses."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def build():
    """The tokenizer as a `tokenizers.Tokenizer`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # no regex split: every byte is a token whatever its neighbours, and no space is ever added
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def config() -> dict:
    """tokenizer_config.json: TorchTitan's HuggingFaceTokenizer reads BOS/EOS from it (and adds them per document)."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
            "add_bos_token": True, "add_eos_token": True, "model_max_length": 1 << 30}


def write(folder: str = FOLDER) -> str:
    os.makedirs(folder, exist_ok=True)
    build().save(os.path.join(folder, "tokenizer.json"), pretty=True)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config(), f, indent=2)
        f.write("\n")
    return folder


if __name__ == "__main__":
    print(write(sys.argv[1] if len(sys.argv) > 1 else FOLDER))
