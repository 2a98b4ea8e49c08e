"""Primus's settings end to end through `python train.py` on CPU, both backends, several settings per run:
evaluation on held-out data (val_loss in the step log, TensorBoard and result.json), eod_mask_loss, lr_decay_iters,
weights-only checkpoints resumed with a fresh optimizer, a MoE setting on a dense model listed as ignored, and the
guide's exported tuning variables."""
import pytest

from test_launch_common import load, run_train, tail

pytestmark = pytest.mark.e2e

RUN = ["training.train_iters=4", "training.lr_warmup_iters=1", "training.timing_warmup_steps=0",
       "training.eval_interval=2", "training.eval_iters=1", "data.eod_mask_loss=true", "checkpoint.save_at_end=true",
       "checkpoint.no_save_optim=true", "checkpoint.no_save_rng=true"]


def tensorboard_scalars(d, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(d / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.parametrize("backend", ["megatron", "torchtitan"])
def test_evaluation_and_weights_only_checkpoints(tmp_path, backend):
    first, again = tmp_path / "first", tmp_path / "again"
    extra = ["training.lr_decay_iters=3"] if backend == "megatron" else []  # torchtitan decays until the last step
    p = run_train([f"backend={backend}", *RUN, *extra, "moe.moe_grouped_gemm=true", f"hydra.run.dir={first}"])
    assert p.returncode == 0, tail(p)
    r = load(first / "result.json")
    assert r["status"] == "ok" and r["config"]["data"]["eod_mask_loss"] is True
    # held-out loss after steps 2 and 4: the step log, TensorBoard and result.json agree
    steps = [s for s, _ in r["val_losses"]]
    assert steps == [2, 4] and r["val_loss"] == r["val_losses"][-1][1]
    for step, v in r["val_losses"]:
        assert f"step {step:>5}/4 | val_loss {v:.4f}" in p.stdout
    tb = tensorboard_scalars(first, "val/loss")
    assert [s for s, _ in tb] == [2, 4] and tb[-1][1] == pytest.approx(r["val_loss"], rel=1e-6)
    # a MoE setting on this dense model: a warning, listed as ignored
    assert [i["key"] for i in r["ignored_settings"]] == ["moe.moe_grouped_gemm"]
    assert "WARNING: moe.moe_grouped_gemm" in p.stdout
    if backend == "megatron":  # the decay ends at lr_decay_iters=3: step 4 runs at min_lr
        [last] = [line for line in p.stdout.splitlines() if line.startswith("step     4/4 | loss")]
        assert "lr 3.000e-04" in last, last
    # weights only: no optimizer state, no RNG files
    ckpt = first / "checkpoints" / "step_000004"
    meta = load(ckpt / "primus_meta.json")
    assert meta["contents"] == {"optimizer": False, "rng": False}
    assert not [f for f in meta["files"] if f.startswith(("rng/", "megatron_rng/"))]

    # resuming it needs no_load_optim (refused before anything starts otherwise), then trains on from its weights
    p = run_train([f"backend={backend}", *RUN[:1], f"checkpoint.resume={ckpt}", "dry_run=true",
                   f"hydra.run.dir={again}"])
    assert p.returncode == 2 and "checkpoint.no_load_optim=true" in p.stdout, tail(p)
    p = run_train([f"backend={backend}", "training.train_iters=5", "training.lr_warmup_iters=1",
                   f"checkpoint.resume={ckpt}", "checkpoint.no_load_optim=true", "checkpoint.no_load_rng=true",
                   f"hydra.run.dir={again}"])
    assert p.returncode == 0, tail(p)
    r2 = load(again / "result.json")
    assert r2["status"] == "ok" and r2["resumed_from"]["step"] == 4 and r2["first_step"] == 5
    assert "weights loaded; fresh optimizer and LR schedule and RNG states" in p.stdout
    # the loaded weights carry the training on: the first resumed loss is near the last one, not a fresh model's
    fresh = r["losses"][0]
    assert abs(r2["losses"][0] - r["losses"][-1]) < abs(fresh - r["losses"][-1])


def test_the_guides_tuning_exports_take_effect(tmp_path):
    """PRIMUS_HIPBLASLT_TUNING=1 PRIMUS_HIPBLASLT_TUNING_STAGE=3 python train.py ...: stage 3 is honoured (it needs
    its results file, and says so), and an explicit key that disagrees wins with a note."""
    env = {"PRIMUS_HIPBLASLT_TUNING": "1", "PRIMUS_HIPBLASLT_TUNING_STAGE": "3"}
    p = run_train(["dry_run=true", f"tuning.root={tmp_path}", f"hydra.run.dir={tmp_path / 'a'}"], env=env)
    assert p.returncode == 2 and "stage 3 trains with tuned GEMMs" in p.stdout, tail(p)
    results = tmp_path / "tuned.txt"
    results.write_text("")
    p = run_train(["dry_run=true", f"hydra.run.dir={tmp_path / 'b'}"],
                  env={**env, "HIPBLASLT_TUNING_OVERRIDE_FILE": str(results)})
    assert p.returncode == 0 and '"won": "env"' in p.stdout and str(results) in p.stdout, tail(p)
    p = run_train(["dry_run=true", "tuning_stage=0", f"hydra.run.dir={tmp_path / 'c'}"], env=env)
    assert p.returncode == 0 and '"won": "config"' in p.stdout, tail(p)


@pytest.mark.parametrize("backend", ["megatron", "torchtitan"])
def test_evaluation_on_the_held_out_share_of_local_jsonl(tmp_path, backend):
    """jsonl text with a local tokenizer: training reads the first 98%, evaluation the rest (megatron's dataset
    split; TorchTitan's Validator over the file's held-out share), end-of-document labels masked."""
    import json
    import random

    from test_torchtitan_e2e import _byte_bpe

    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "omega", "train", "model", "token", "layer", "shard"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 60))) for _ in range(300)]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    _byte_bpe(str(tmp_path / "tok"), texts)
    run = tmp_path / "run"
    p = run_train([f"backend={backend}", "data=jsonl", f"data.path={data}", f"data.tokenizer={tmp_path / 'tok'}",
                   "data.eod_mask_loss=true", "training.train_iters=2", "training.lr_warmup_iters=0",
                   "training.eval_interval=2", "training.eval_iters=1", f"hydra.run.dir={run}"])
    assert p.returncode == 0, tail(p)
    r = load(run / "result.json")
    assert [s for s, _ in r["val_losses"]] == [2] and r["val_loss"] > 0
