"""logging.console_level / logging.file_level: the levels of the run log's two sinks (console, <run_dir>/train.log),
and Primus's sink_level / stderr_sink_level / file_sink_level mapped onto them by the importer."""
import logging

import pytest
import yaml

from conftest import compose_cfg


def test_levels_are_python_s_and_a_bad_one_names_the_allowed_values():
    from hydra.errors import ConfigCompositionException

    from primus.features.logging import levels

    assert levels(compose_cfg([])) == (logging.INFO, logging.INFO)
    cfg = compose_cfg(["logging.console_level=WARNING", "logging.file_level=DEBUG"])
    assert levels(cfg) == (logging.WARNING, logging.DEBUG)
    with pytest.raises(ConfigCompositionException) as e:  # train.py prints the same message and exits 2
        compose_cfg(["logging.console_level=LOUD"])
    msg = f"{e.value} {e.value.__cause__}"
    assert "LOUD" in msg and "logging.console_level" in msg and "WARNING" in msg and "DEBUG" in msg


def test_apply_levels_sets_the_console_and_file_handlers(tmp_path):
    from primus.features.logging import apply_levels

    root = logging.getLogger()
    console, file = logging.StreamHandler(), logging.FileHandler(tmp_path / "train.log")
    root.addHandler(console)
    root.addHandler(file)
    before = logging.getLogger("primus").level
    try:
        apply_levels(compose_cfg(["logging.console_level=ERROR", "logging.file_level=DEBUG"]))
        assert console.level == logging.ERROR and file.level == logging.DEBUG
        assert logging.getLogger("primus").level == logging.DEBUG  # emits what the more verbose sink shows
        apply_levels(compose_cfg(["logging.console_level=WARNING"]))
        assert console.level == logging.WARNING and file.level == logging.INFO
        assert logging.getLogger("primus").level == logging.NOTSET  # back to the root's level
    finally:
        root.removeHandler(console)
        root.removeHandler(file)
        file.close()
        logging.getLogger("primus").setLevel(before)


def test_each_sink_of_the_run_log_keeps_its_own_level(tmp_path, capsys):
    from types import SimpleNamespace

    from primus import train_loop

    ctx = SimpleNamespace(is_rank0=True, run_dir=str(tmp_path))
    train_loop._LEVELS[ctx.run_dir] = (logging.INFO, logging.WARNING)  # as train() sets them
    try:
        train_loop._say(ctx, "step     1/3 | loss 7.6")
        train_loop._say(ctx, "[primus] WARNING: a.b = 1: ignored", logging.WARNING)
    finally:
        train_loop._close_log(ctx)
    out = capsys.readouterr().out
    assert "step     1/3" in out and "WARNING: a.b" in out
    log = (tmp_path / "train.log").read_text()
    assert "step" not in log and "[primus][WARNING] - [primus] WARNING: a.b = 1: ignored" in log
    assert ctx.run_dir not in train_loop._LEVELS  # forgotten with the run's log


def test_importer_maps_primus_s_sink_levels(tmp_path):
    from primus.importer.core import import_experiment

    def imported(**over):
        src = {"work_group": "a", "user_name": "b", "exp_name": "c", "workspace": "./o",
               "modules": {"pre_trainer": {"framework": "megatron", "config": "pre_trainer.yaml",
                                           "model": "llama2_7B.yaml", "overrides": {"train_iters": 2, **over}}}}
        p = tmp_path / "e.yaml"
        p.write_text(yaml.safe_dump(src))
        return import_experiment(str(p))

    s = imported(stderr_sink_level="WARNING", file_sink_level="debug").sets
    assert s["logging.console_level"] == "WARNING" and s["logging.file_level"] == "DEBUG"
    s = imported(sink_level="ERROR", stderr_sink_level="INFO", file_sink_level="DEBUG").sets  # sink_level wins
    assert s["logging.console_level"] == s["logging.file_level"] == "ERROR"
    imp = imported(stderr_sink_level="TRACE")  # loguru's, not Python's: listed with what is allowed
    (item,) = [i for i in imp.listed if i.key == "stderr_sink_level"]
    assert "not importable as logging.console_level" in item.reason and "WARNING" in item.reason
    assert "logging.console_level" not in imp.sets


@pytest.mark.e2e
def test_a_warning_console_prints_no_step_lines_while_train_log_keeps_them(tmp_path):
    from test_launch_common import SHORT, run_train

    p = run_train(["model=debug", "device=cpu", "training.seq_length=64", "training.micro_batch_size=2",
                   "training.global_batch_size=2", *SHORT, "logging.console_level=WARNING",
                   f"hydra.run.dir={tmp_path}"],
                  timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]
    log = (tmp_path / "train.log").read_text()
    steps = [line for line in log.splitlines() if "[primus][INFO] - step " in line]
    assert len(steps) == 3, log[-3000:]
    assert "step " not in p.stdout and "[primus] resolved" not in p.stdout and "parameters;" not in p.stdout, p.stdout
    assert "[primus] model debug" in log  # INFO lines stay in the file
    assert "megatron layer spec" in log and "megatron layer spec" not in p.stdout  # Python logging: the same split
