"""megatron_preprocess (local jsonl/text -> indexed dataset with a local byte-level BPE) and training on real data."""
import glob
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _corpus(n_docs=300):
    """Documents from this repository's own sources: local, deterministic, real text."""
    docs = []
    for path in sorted(glob.glob(os.path.join(ROOT, "primus", "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for block in text.split("\n\n"):
            block = block.strip()
            if len(block) > 40:
                docs.append(block)
    return docs[:n_docs]


@pytest.fixture(scope="module")
def local_data(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    d = tmp_path_factory.mktemp("data")
    docs = _corpus()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    (d / "tok").mkdir()
    tok.save(str(d / "tok" / "tokenizer.json"))
    with open(d / "docs.jsonl", "w") as f:
        for t in docs:
            f.write(json.dumps({"text": t}) + "\n")
    return d, docs


@pytest.mark.e2e
def test_preprocess_cli_writes_an_indexed_dataset_that_round_trips(local_data):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from tokenizers import Tokenizer

    d, docs = local_data
    prefix = str(d / "out" / "corpus")
    p = subprocess.run([sys.executable, "-m", "primus.data.megatron_preprocess", "--input", str(d / "docs.jsonl"),
                        "--tokenizer", str(d / "tok"), "--output-prefix", prefix],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    stats = json.loads(p.stdout.strip().splitlines()[-1])
    assert stats["documents"] == len(docs) and stats["dtype"] == "uint16"
    ds = IndexedDataset(prefix)
    tok = Tokenizer.from_file(str(d / "tok" / "tokenizer.json"))
    eod = tok.token_to_id("<|endoftext|>")
    assert len(ds) == len(docs)
    for i in (0, len(docs) // 2, len(docs) - 1):
        ids = ds[i].tolist()
        assert ids[-1] == eod
        assert tok.decode(ids[:-1]) == docs[i]
    assert sum(len(ds[i]) for i in range(len(ds))) == stats["tokens"]


def test_preprocess_reads_plain_text_and_names_missing_eod(local_data, tmp_path):
    from primus.data.megatron_preprocess import preprocess

    d, docs = local_data
    txt = tmp_path / "docs.txt"
    txt.write_text("\n".join(x.replace("\n", " ") for x in docs[:10]) + "\n\n")
    assert preprocess(str(txt), str(d / "tok"), str(tmp_path / "t"))["documents"] == 10
    with pytest.raises(ValueError, match="--eod-token"):
        preprocess(str(txt), str(d / "tok"), str(tmp_path / "u"), eod_token="<nope>")


def _train(run_dir, overrides, steps=6):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", f"training.train_iters={steps}", "device=cpu",
           "training.lr_warmup_iters=1", "training.timing_warmup_steps=0", *overrides]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.loads((run_dir / "result.json").read_text())
    assert res["status"] == "ok"
    return res


@pytest.mark.slow
def test_trains_on_jsonl_through_an_indexed_dataset(local_data, tmp_path):
    """data=jsonl is converted once into the run dir, then read by megatron-core's GPTDataset."""
    d, _ = local_data
    res = _train(tmp_path / "run", ["data=jsonl", f"data.path={d / 'docs.jsonl'}", f"data.tokenizer={d / 'tok'}"],
                 steps=8)
    assert os.path.isfile(tmp_path / "run" / "data" / "megatron_indexed.idx")
    losses = res["losses"]
    assert abs(losses[0] - 7.62) < 0.15
    assert min(losses[-3:]) < losses[0] - 0.5, losses  # real text: token frequencies are learnt within steps


class _Samples:
    """A dataset of distinct samples (the index is in every token), as megatron-core's GPTDataset returns them."""

    def __len__(self):
        return 50

    def __getitem__(self, i):
        import numpy as np

        t = np.full(8, i, dtype=np.int64)
        return {"tokens": t, "labels": t + 1, "loss_mask": np.ones(8, np.float32), "position_ids": np.arange(8)}


def test_data_workers_give_the_main_process_s_batches_in_its_order_from_any_position():
    """data.num_workers (Megatron-LM's --num-workers) reads in DataLoader workers: the same micro batches for this
    dp rank, and a resume that moves the position restarts the workers there."""
    from primus.backends.megatron.data import MicroBatches

    def take(it, n):
        return [next(it)["tokens"][:, 0].tolist() for _ in range(n)]

    main, workers = (MicroBatches(_Samples(), 2, 1, 3, "cpu", num_workers=w) for w in (0, 2))
    expected = take(main, 12)
    assert expected[:2] == [[2, 3], [8, 9]] and take(workers, 12) == expected  # rank 1 of 3: rows of 6
    for it in (main, workers):
        it.next_micro = 4  # what a checkpoint's consumed samples set before the first batch
    assert take(workers, 5) == take(main, 5) == expected[4:9]


@pytest.mark.e2e
def test_a_megatron_run_with_data_workers_trains_on_the_same_batches(tmp_path):
    base = ["backend=megatron", "model=debug"]
    a = _train(tmp_path / "a", base, steps=3)
    b = _train(tmp_path / "b", base + ["data.num_workers=2"], steps=3)
    assert b["losses"] == a["losses"]
