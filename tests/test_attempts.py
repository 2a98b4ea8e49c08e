"""primus/attempts.py: a run dir run again keeps the earlier attempt's result.json and .hydra files."""
import json

from primus.attempts import KeepAttempts, archive, previous_attempts


def test_archive_moves_result_and_copies_hydra_files_then_counts_attempts(tmp_path):
    assert archive(str(tmp_path)) is None and previous_attempts(str(tmp_path)) == []
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- training.train_iters=6\n")
    (tmp_path / "result.json").write_text(json.dumps({"status": "preempted"}))
    first = archive(str(tmp_path))
    assert first == str(tmp_path / "attempts" / "1") and not (tmp_path / "result.json").exists()
    assert json.loads((tmp_path / "attempts" / "1" / "result.json").read_text())["status"] == "preempted"
    assert (tmp_path / "attempts" / "1" / ".hydra" / "overrides.yaml").read_text().startswith("- training")
    (tmp_path / "result.json").write_text("{}")
    assert archive(str(tmp_path), hydra_files=False) == str(tmp_path / "attempts" / "2")
    assert not (tmp_path / "attempts" / "2" / ".hydra").exists()
    assert previous_attempts(str(tmp_path)) == [str(tmp_path / "attempts" / "1"), str(tmp_path / "attempts" / "2")]


def test_callback_archives_before_hydra_writes_the_new_attempts_files(tmp_path):
    from omegaconf import OmegaConf

    (tmp_path / "result.json").write_text("{}")
    KeepAttempts().on_run_start(OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path)}}}))
    assert (tmp_path / "attempts" / "1" / "result.json").exists()
    KeepAttempts().on_run_start(OmegaConf.create({"hydra": {"run": {"dir": str(tmp_path / "new")}}}))
    assert not (tmp_path / "new").exists()
