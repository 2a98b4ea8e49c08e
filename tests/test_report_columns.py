"""primus.report compares what differs: columns are the overrides, group choices and config values that differ
between the runs (plus the metrics some row has), errors are whole, describe-only run dirs are skipped; a run that
only described itself keeps no run dir."""
import json
import os

from primus.report import collect, compared_keys, main, to_csv, to_markdown
from primus.results import discard_described_run


def _run(d, overrides, result=None):
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if result is not None:
        (d / "result.json").write_text(json.dumps({"overrides": overrides, **result}))
    return str(d)


def _ok(tps, model, mbs, seq=128, choices_model=None):
    return {"status": "ok", "tokens_per_s_per_gpu": tps, "world_size": 1, "final_loss": 3.0,
            "choices": {"model": choices_model or model, "precision": "bf16"},
            "config": {"model": {"name": model, "num_layers": 4 if model == "debug" else 32},
                       "precision": {"bf16": True}, "training": {"micro_batch_size": mbs, "seq_length": seq},
                       "job_id": None, "extra": {"note": model}}}


def test_columns_are_what_differs_between_runs(tmp_path):
    a = _run(tmp_path / "a", ["training.train_iters=3"], _ok(100.0, "debug", 4))
    b = _run(tmp_path / "b", ["model=llama3_8b", "training.train_iters=3"], _ok(50.0, "llama3_8b", 4))
    c = _run(tmp_path / "c", [], _ok(80.0, "debug", 2))
    rows = collect([a, b, c])
    keys = compared_keys(rows)
    # model differs by override (and so by choice: shown once); its values (num_layers) follow the model; micro
    # batch differs in the config; precision, seq_length, job_id, extra do not tell them apart
    assert keys == ["training.train_iters", "model", "training.micro_batch_size"], keys
    head = to_csv(rows).splitlines()[0].split(",")
    assert head[:3] == keys and "status" in head and "tokens/s/GPU" in head
    assert "MFU" not in head and "error" not in head and "fits" not in head  # no row has them
    md = to_markdown(rows)
    assert "| 3 | llama3_8b | 4 | ok | 50 |" in md and "| - | debug | 2 | ok | 80 |" in md


def test_the_whole_error_is_in_the_table(tmp_path):
    err = "ConfigError: invalid config (1 problem):\n  - x = 1: too big. Fix: " + "use a smaller value " * 20
    d = _run(tmp_path / "s" / "0", ["x=1"], {"status": "invalid", "error": err})
    _run(tmp_path / "s" / "1", ["x=2"], {"status": "ok", "tokens_per_s_per_gpu": 1.0})
    md = to_markdown(collect([str(tmp_path / "s")]))
    assert " ".join(err.split()) in md and d.endswith("0")


def test_describe_only_run_dirs_are_skipped_but_sweep_points_are_rows(tmp_path):
    ran = _run(tmp_path / "runs" / "1", ["precision=fp8"], {"status": "ok", "tokens_per_s_per_gpu": 5.0})
    dry_old = _run(tmp_path / "runs" / "2", ["dry_run=true"])  # an older dry run's dir: no result.json
    planned = _run(tmp_path / "runs" / "3", ["mode=plan"], {"status": "planned", "describe_only": True})
    rows = collect([ran, dry_old, planned])
    assert [r["run_dir"] for r in rows] == [ran]
    sw = tmp_path / "sweep"
    _run(sw / "0", ["dry_run=true", "precision=bf16"], {"status": "valid", "describe_only": True})
    _run(sw / "1", ["dry_run=true", "precision=fp8"], {"status": "invalid", "error": "ConfigError: no"})
    assert [r["status"] for r in collect([str(sw)])] == ["valid", "invalid"]


def test_report_writes_the_sweep_png_for_any_runs(tmp_path, capsys):
    a = _run(tmp_path / "a", ["precision=bf16"], {"status": "ok", "tokens_per_s_per_gpu": 5.0})
    b = _run(tmp_path / "b", ["precision=fp8"], {"status": "ok", "tokens_per_s_per_gpu": 7.0})
    png = tmp_path / "out" / "t.png"
    assert main([a, b, "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("| precision | status |")


def test_a_run_dir_with_only_hydras_files_is_discarded(tmp_path):
    d = tmp_path / "run"
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "config.yaml").write_text("a: 1\n")
    (d / "train.log").write_text("")
    assert discard_described_run(str(d)) and not d.exists()
    kept = tmp_path / "job"
    (kept / ".hydra").mkdir(parents=True)
    (kept / "result.json").write_text("{}")  # an earlier attempt's result: the dir is a job's, it stays
    assert not discard_described_run(str(kept)) and os.path.isdir(kept)


def test_a_sweeps_table_has_its_swept_keys_only(tmp_path):
    """Points of one preset sweep differ in every group their presets choose; the table shows what was swept."""
    sw = tmp_path / "sweep"
    _run(sw / "0", ["experiment=a", "dry_run=true"], _ok(1.0, "debug", 4))
    _run(sw / "1", ["experiment=b", "dry_run=true"], _ok(2.0, "llama3_8b", 2))
    rows = collect([str(sw)])
    assert compared_keys(rows) == ["experiment"]
    assert compared_keys(rows + collect([_run(tmp_path / "run", [], _ok(3.0, "debug", 2))])) == \
        ["experiment", "dry_run", "model", "training.micro_batch_size"]  # runs of several origins: what differs
