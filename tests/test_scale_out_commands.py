"""Every scale-out command of README.md and docs/*.md (several processes, nodes, or a parallel layout) dry-runs
clean, and its Slurm commands pass the checks the launcher runs before submitting (primus/launch/submit.py).

The commands are read from the docs themselves, so a new one is checked the day it is written; KNOWN pins a few that
must be found, so a broken extraction cannot pass by finding nothing. In-process: each sweep point is composed with
Hydra's compose API and run through primus.run.run with dry_run=true, as `python train.py` would."""
import glob
import os
import re
import shlex

import pytest
from hydra import compose, initialize_config_dir

from conftest import CONF, ROOT, compose_dict
from primus import run as primus_run
from primus.config.hydra_compat import quote_numeric_group_choices

SCALE_OUT = re.compile(r"launcher\.(nproc_per_node|nnodes)=|parallel=|parallel\.(tensor|pipeline|context|expert|"
                       r"virtual_pipeline|data)_[a-z_]*=|hydra/launcher=slurm")
COMMAND = re.compile(r"python train\.py ([^`#\n|]*)")

KNOWN = [
    "model=llama3_8b parallel.tensor_model_parallel_size=8 launcher.nproc_per_node=8 dry_run=true",
    "-m hydra/launcher=slurm +cluster=h200 launcher.nnodes=2 launcher.nproc_per_node=8",
    "-m hydra/launcher=slurm +cluster=h200 launcher.nproc_per_node=8 launcher.nnodes=4 model=llama3_70b",
]


def doc_commands():
    found = {}
    for path in [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]:
        with open(path) as f:
            text = re.sub(r"\\\n\s*", " ", f.read())  # a command continued over lines is one command
            for m in COMMAND.finditer(text):
                args = m.group(1).strip()
                if SCALE_OUT.search(args) and not re.search(r"[<>\[\]]|\.\.\.", args):  # placeholders: not runnable
                    found.setdefault(args, os.path.relpath(path, ROOT))
    return found


COMMANDS = doc_commands()


def test_the_docs_scale_out_commands_are_found():
    missing = [k for k in KNOWN if k not in COMMANDS]
    assert not missing, (missing, sorted(COMMANDS))


def points(args):
    """The sweep points of a command line, as Hydra's basic sweeper expands them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(quote_numeric_group_choices(args))
    return [list(p) for batch in BasicSweeper.split_arguments(parsed, None) for p in batch]


@pytest.mark.parametrize("line", sorted(COMMANDS), ids=lambda s: s[:80])
def test_doc_command_dry_runs_clean(line, capsys, monkeypatch):
    for k in ("WORLD_SIZE", "SLURM_JOB_ID", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(k, raising=False)
    args = [a for a in shlex.split(line) if a != "-m"]
    slurm = "hydra/launcher=slurm" in args
    for point in points(args):
        if slurm:  # what the Slurm launcher checks before it submits: the point at its job's world size
            from primus.launch.submit import check_point

            with initialize_config_dir(config_dir=CONF, version_base="1.3"):
                sweep_cfg = compose("config", overrides=point, return_hydra_config=True)
            check_point(sweep_cfg)
        job = [a for a in point if not a.startswith(("hydra/", "+cluster=", "hydra."))]
        assert primus_run.run(compose_dict([*job, "dry_run=true"])) == 0, (COMMANDS[line], line)
        assert '"world_size_from"' in capsys.readouterr().out
