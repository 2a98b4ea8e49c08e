"""primus/attempts.py: a run dir run again keeps the earlier attempt's result.json and .hydra files."""
import json
import os

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


def test_callback_finds_a_jobs_run_dir_from_the_composed_config(tmp_path, monkeypatch):
    """The real run dir is an interpolation of Hydra's own config (outputs/jobs/<job_id>), which Hydra has not
    published when it calls on_run_start: the callback must still find it and keep the earlier attempt's files."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from conftest import ROOT

    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["job_id=rerun"], return_hydra_config=True)
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "outputs" / "jobs" / "rerun"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("- job_id=rerun\n")
    (job / "result.json").write_text("{}")
    before = HydraConfig.instance().cfg
    HydraConfig.instance().cfg = None  # as when Hydra calls on_run_start
    try:
        KeepAttempts().on_run_start(cfg)
    finally:
        HydraConfig.instance().cfg = before  # this process's later tests see what they saw before
    assert (job / "attempts" / "1" / ".hydra" / "overrides.yaml").read_text() == "- job_id=rerun\n"
    assert (job / "attempts" / "1" / "result.json").exists()
