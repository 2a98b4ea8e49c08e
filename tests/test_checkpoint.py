"""primus/checkpoint.py with a stand-in trainer (no backend, no torch.distributed): atomic commit, crash mid-save,
corruption / truncation detection, resume=auto fallback, keep_last pruning, explicit bad paths as config errors."""
import json
import os
import types

import pytest

from primus import checkpoint as ck
from primus.config.errors import ConfigError


class FakeTrainer:
    """Writes a 'model' file whose content depends on the step; load records what it read."""

    def __init__(self, fail_at=None):
        self.fail_at = fail_at
        self.loaded = None

    def save_checkpoint(self, path, step):
        with open(os.path.join(path, "model.bin"), "wb") as f:
            f.write(bytes([step % 256]) * 4096)
        if self.fail_at == step:
            raise RuntimeError("disk died mid-save")
        return {"consumed_samples": 8 * step}

    def load_checkpoint(self, path, meta=None):
        with open(os.path.join(path, "model.bin"), "rb") as f:
            self.loaded = f.read()[0]
        return {}


def manager(cfg_of, tmp_path, trainer, **ckpt):
    over = [f"checkpoint.{k}={v}" for k, v in ckpt.items()]
    cfg = cfg_of(["backend=torchtitan", *over])
    ctx = types.SimpleNamespace(run_dir=str(tmp_path))
    msgs = []
    return ck.CheckpointManager(cfg, ctx, trainer, say=msgs.append), msgs


def test_save_commits_whole_checkpoint_with_meta_written_last(cfg_of, tmp_path):
    m, _ = manager(cfg_of, tmp_path, FakeTrainer(), interval=1)
    path = m.save(3)
    assert path == str(tmp_path / "checkpoints" / "step_000003")
    meta = json.load(open(os.path.join(path, ck.META_FILE)))
    assert meta["step"] == 3 and meta["backend"] == "torchtitan" and meta["world_size"] == 1
    assert meta["trainer_state"] == {"consumed_samples": 24}
    assert set(meta["files"]) == {"model.bin", "rng/rank_00000.pt"}
    assert meta["files"]["model.bin"]["size"] == 4096
    assert ck.verify(path) == []
    assert not [n for n in os.listdir(tmp_path / "checkpoints") if n.startswith(ck.TMP_PREFIX)]


def test_crash_mid_save_leaves_nothing_that_loads(cfg_of, tmp_path):
    m, _ = manager(cfg_of, tmp_path, FakeTrainer(fail_at=4), interval=1, keep_last=5)
    m.save(2)
    with pytest.raises(RuntimeError, match="mid-save"):
        m.save(4)
    root = tmp_path / "checkpoints"
    # the half-written one is only a tmp dir
    assert sorted(os.listdir(root)) == [".tmp-step_000004", ck.HEAD_FILE, "step_000002"]
    assert ck.list_checkpoints(str(root)) == [(2, str(root / "step_000002"))]
    path, skipped = ck.find_latest_valid(str(root))
    assert path == str(root / "step_000002") and skipped == []
    # the injected-failure hook fails after the backend files, before the commit, the same way
    os.environ["PRIMUS_INJECT_SAVE_FAILURE_AT_STEP"] = "5"
    try:
        m2, _ = manager(cfg_of, tmp_path, FakeTrainer(), interval=1, keep_last=5)
        with pytest.raises(RuntimeError, match="PRIMUS_INJECT_SAVE_FAILURE_AT_STEP"):
            m2.save(5)
    finally:
        del os.environ["PRIMUS_INJECT_SAVE_FAILURE_AT_STEP"]
    assert ck.find_latest_valid(str(root))[0] == str(root / "step_000002")
    # the next successful save clears the leftovers
    m2.save(6)
    assert sorted(os.listdir(root)) == [ck.HEAD_FILE, "step_000002", "step_000006"]


def test_meta_written_last_a_dir_without_it_is_invalid(cfg_of, tmp_path):
    m, _ = manager(cfg_of, tmp_path, FakeTrainer(), interval=1)
    p = m.save(1)
    os.remove(os.path.join(p, ck.META_FILE))
    assert any("no primus_meta.json" in x for x in ck.verify(p))


@pytest.mark.parametrize("damage", ["truncate", "flip", "remove"])
def test_damaged_file_detected_and_auto_falls_back(cfg_of, tmp_path, damage):
    m, _ = manager(cfg_of, tmp_path, FakeTrainer(), interval=1, keep_last=3)
    m.save(1)
    m.save(2)
    bad = tmp_path / "checkpoints" / "step_000002" / "model.bin"
    if damage == "truncate":
        bad.write_bytes(bad.read_bytes()[:100])
    elif damage == "flip":
        data = bytearray(bad.read_bytes())
        data[10] ^= 0xFF
        bad.write_bytes(bytes(data))
    else:
        bad.unlink()
    problems = ck.verify(str(bad.parent))
    want = {"truncate": "truncated", "flip": "corrupt", "remove": "missing"}[damage]
    assert len(problems) == 1 and "model.bin" in problems[0] and want in problems[0], problems

    t = FakeTrainer()
    r, msgs = manager(cfg_of, tmp_path, t, resume="auto")
    got = r.resume()
    assert got["step"] == 1 and got["path"].endswith("step_000001") and t.loaded == 1
    assert got["skipped"][0][0].endswith("step_000002")
    text = "\n".join(msgs)
    assert "step_000002 is not valid" in text and "model.bin" in text and "falling back" in text
    assert "using " + got["path"] in text

    # an explicit path to the damaged one is a config error naming the path and the problem
    r2, _ = manager(cfg_of, tmp_path, FakeTrainer(), resume=str(bad.parent))
    with pytest.raises(ConfigError) as e:
        r2.precheck() if damage != "flip" else r2.resume()  # a flipped byte needs the crc pass
    assert "checkpoint.resume" in str(e.value) and str(bad.parent) in str(e.value) and "model.bin" in str(e.value)


def test_explicit_resume_path_errors(cfg_of, tmp_path):
    m, _ = manager(cfg_of, tmp_path, FakeTrainer(), resume=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="not a directory"):
        m.precheck()
    (tmp_path / "empty").mkdir()
    m, _ = manager(cfg_of, tmp_path, FakeTrainer(), resume=str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="no primus_meta.json"):
        m.precheck()
    # a checkpoint of the other backend
    w, _ = manager(cfg_of, tmp_path, FakeTrainer(), interval=1)
    p = w.save(1)
    meta = json.load(open(os.path.join(p, ck.META_FILE)))
    meta["backend"] = "megatron"
    json.dump(meta, open(os.path.join(p, ck.META_FILE), "w"))
    m, _ = manager(cfg_of, tmp_path, FakeTrainer(), resume=p)
    with pytest.raises(ConfigError, match="backend megatron"):
        m.precheck()


def test_keep_last_prunes_oldest(cfg_of, tmp_path):
    m, _ = manager(cfg_of, tmp_path, FakeTrainer(), interval=1, keep_last=2)
    for s in range(1, 6):
        m.save(s)
    assert [s for s, _ in ck.list_checkpoints(str(tmp_path / "checkpoints"))] == [5, 4]
    m0, _ = manager(cfg_of, tmp_path / "all", FakeTrainer(), interval=1, keep_last=0)
    for s in range(1, 4):
        m0.save(s)
    assert len(ck.list_checkpoints(str(tmp_path / "all" / "checkpoints"))) == 3


def test_auto_with_nothing_starts_fresh_and_requeued_job_resumes(cfg_of, tmp_path, monkeypatch):
    r, msgs = manager(cfg_of, tmp_path, FakeTrainer(), resume="auto")
    assert r.resume() is None and "no valid checkpoint" in msgs[0]
    w, _ = manager(cfg_of, tmp_path, FakeTrainer(), interval=1)
    w.save(2)
    t = FakeTrainer()
    fresh, _ = manager(cfg_of, tmp_path, t)  # resume=null ...
    assert fresh.resume() is None
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # ... unless this is a requeued Slurm job
    got = fresh.resume()
    assert got["step"] == 2 and t.loaded == 2


def test_due():
    cfg = types.SimpleNamespace(checkpoint=types.SimpleNamespace(interval=3, save_at_end=True, keep_last=2, dir=None,
                                                                 resume=None),
                                backend=types.SimpleNamespace(name=types.SimpleNamespace(value="megatron")))
    m = ck.CheckpointManager(cfg, types.SimpleNamespace(run_dir="/x"), None)
    assert [s for s in range(1, 8) if m.due(s, s == 7)] == [3, 6, 7]


# ------------------------------------------------------------------ history: branches, not step numbers

def _meta(path):
    return json.load(open(os.path.join(path, ck.META_FILE)))


def test_rollback_starts_a_branch_that_prune_and_auto_follow(cfg_of, tmp_path):
    root = tmp_path / "checkpoints"
    first, _ = manager(cfg_of, tmp_path, FakeTrainer(), interval=10, keep_last=2)
    for s in (10, 20, 30, 40):
        first.save(s)
    assert [s for s, _ in ck.list_checkpoints(str(root))] == [40, 30]
    # roll back to step 30 (a loss spike after it) and save step 31
    t = FakeTrainer()
    back, msgs = manager(cfg_of, tmp_path, t, interval=10, keep_last=2, resume=str(root / "step_000030"))
    got = back.resume()
    assert got["step"] == 30 and got["branch"] == 2 and t.loaded == 30
    assert any("branch 2 starts from step_000030" in m and "step_000040" in m for m in msgs), msgs
    back.save(31)
    # the checkpoint just resumed from is on the branch: kept; the abandoned step 40 is off it: kept, not pruned
    assert [s for s, _ in ck.list_checkpoints(str(root))] == [40, 31, 30]
    assert _meta(str(root / "step_000031"))["parent"]["name"] == "step_000030"
    # resume=auto follows the branch: step 31, not the abandoned step 40 (which used to win by its number)
    t2 = FakeTrainer()
    auto, _ = manager(cfg_of, tmp_path, t2, interval=10, keep_last=2, resume="auto")
    got = auto.resume()
    assert got["path"] == str(root / "step_000031") and got["step"] == 31 and got["branch"] == 2
    # the new branch reaching step 40 sets the abandoned one aside instead of overwriting it
    abandoned_id = _meta(str(root / "step_000040"))["id"]
    auto.save(40)
    aside = root / f"step_000040~{abandoned_id}"
    assert aside.is_dir() and _meta(str(aside))["branch"] == 1
    assert _meta(str(root / "step_000040"))["branch"] == 2
    # keep_last=2 on branch 2: 40 and 31; step 30 pruned now; the set-aside one stays
    assert [s for s, _ in ck.list_checkpoints(str(root))] == [40, 31]
    h = auto.history()
    assert h["branch"] == 2 and h["on_branch"] == [str(root / "step_000040"), str(root / "step_000031")]
    assert h["off_branch"] == [str(aside)]


def test_every_checkpoint_damaged_new_saves_survive_and_requeue_keeps_progress(cfg_of, tmp_path):
    root = tmp_path / "checkpoints"
    w, _ = manager(cfg_of, tmp_path, FakeTrainer(), interval=1, keep_last=2)
    for s in (1, 2, 3):
        w.save(s)
    for s in (2, 3):
        (root / ck.step_dir_name(s) / "model.bin").write_bytes(b"x")  # both kept ones damaged
    run, msgs = manager(cfg_of, tmp_path, FakeTrainer(), interval=1, keep_last=2, resume="auto")
    got = run.resume()
    assert got["path"] is None and got["step"] == 0 and len(got["skipped"]) == 2
    assert any("no valid checkpoint on the current branch" in m for m in msgs)
    run.save(1)
    run.save(2)
    # the new saves are the branch: none is deleted as soon as it is written; the damaged ones are set aside
    assert [s for s, _ in ck.list_checkpoints(str(root))] == [3, 2, 1]
    assert all(os.path.isdir(p) for p in run.saved)
    assert sorted(n for n in os.listdir(root) if "~" in n) == sorted(
        n for n in os.listdir(root) if n.startswith("step_000002~"))
    # a requeued job (resume=auto) keeps the progress: the new branch's step 2
    again, _ = manager(cfg_of, tmp_path, FakeTrainer(), resume="auto")
    assert again.resume()["path"] == str(root / "step_000002")


def test_out_of_space_before_the_save_is_refused_with_the_numbers(cfg_of, tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    m, _ = manager(cfg_of, tmp_path, FakeTrainer(), interval=1, keep_last=3)
    m.save(1)
    usage = ck.shutil.disk_usage(str(root))
    monkeypatch.setattr(ck.shutil, "disk_usage", lambda p: usage._replace(free=1000))
    with pytest.raises(ck.OutOfSpace) as e:
        m.save(2)
    msg = str(e.value)
    assert str(root) in msg and "1,000 bytes free" in msg and f"{m.last_size:,} bytes" in msg
    assert "keep_last=3" in msg and "intact" in msg
    assert sorted(os.listdir(root)) == [ck.HEAD_FILE, "step_000001"] and ck.verify(str(root / "step_000001")) == []


class FullDiskTrainer(FakeTrainer):
    """Fails like a full disk inside the backend's writer: a plain OSError, or DCP's CheckpointException, which
    wraps each rank's failure in `failures`."""

    def __init__(self, wrap):
        super().__init__()
        self.wrap = wrap

    def save_checkpoint(self, path, step):
        with open(os.path.join(path, "model.bin"), "wb") as f:
            f.write(b"\0" * 4096)
        err = OSError(28, "No space left on device", os.path.join(path, "model.bin"))
        if not self.wrap:
            raise err
        from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

        raise CheckpointException("save", {0: _wrap_exception(err)})


@pytest.mark.parametrize("wrap", [False, True])
def test_out_of_space_while_saving_removes_the_partial_save(cfg_of, tmp_path, wrap):
    root = tmp_path / "checkpoints"
    m, _ = manager(cfg_of, tmp_path, FakeTrainer(), interval=1)
    m.save(1)
    m.trainer = FullDiskTrainer(wrap)
    with pytest.raises(ck.OutOfSpace, match="ran out of space while saving") as e:
        m.save(2)
    assert str(root) in str(e.value) and "bytes free" in str(e.value)
    assert sorted(os.listdir(root)) == [ck.HEAD_FILE, "step_000001"]  # no partial save, the old one intact
    assert ck.verify(str(root / "step_000001")) == []


def test_rng_files_load_without_pickled_code(cfg_of, tmp_path):
    import torch

    m, _ = manager(cfg_of, tmp_path, FakeTrainer(), interval=1)
    p = m.save(1)
    st = torch.load(os.path.join(p, "rng", "rank_00000.pt"), weights_only=True)
    assert set(st) >= {"python", "numpy", "torch"}


def test_fingerprint_leaves_out_logging_and_profiling(cfg_of):
    base = ck.config_fingerprint(cfg_of([]))
    assert ck.config_fingerprint(cfg_of(["logging.tensorboard=false"])) == base
    assert ck.config_fingerprint(cfg_of(["profile.enabled=true"])) == base
    assert ck.config_fingerprint(cfg_of(["training.lr=0.5"])) != base
