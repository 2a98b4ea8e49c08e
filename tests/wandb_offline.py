"""Read back the history of a W&B offline run (tests only).

wandb 0.31 writes `<dir>/wandb/offline-run-*/run-*.wandb` and no longer ships the Python reader older releases had
(wandb.sdk.internal.datastore). The file is a 7-byte header (":W&B", magic 0xBEE1, version) and then LevelDB's log
format: 32 KiB blocks of records (crc32c, length, type FULL/FIRST/MIDDLE/LAST, payload); each payload is a
serialized `wandb.proto.wandb_internal_pb2.Record`. This module undoes just that framing.
"""
import glob
import os
import struct

BLOCK = 32768
HEADER = 7


def _payloads(data: bytes):
    pos, buf = HEADER, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            break
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            yield buf
            buf = b""


def history(run_dir: str):
    """[{key: value}] per logged step of the one offline run under run_dir/wandb."""
    from wandb.proto import wandb_internal_pb2 as pb

    files = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    assert len(files) == 1, files
    rows = []
    with open(files[0], "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:7]
    for payload in _payloads(data):
        rec = pb.Record()
        rec.ParseFromString(payload)
        if rec.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): float(i.value_json) for i in rec.history.item
                         if not (i.key or "").startswith("_") or i.key == "_step"})
    return rows
