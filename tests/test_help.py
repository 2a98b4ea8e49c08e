"""`python train.py --help` answers: groups with their options and one-line descriptions, the modes, the presets,
examples; schema entries are never options; `--hydra-help` lists Hydra's groups."""
import os

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException
from conftest import CONF
from test_launch_common import run_train

from primus import exit_codes
from primus.config.help import describe, groups_text, options, presets_text
from primus.config.hydra_compat import one_compose_per_run, quick_group_listing
from primus.config.schema import GROUPS


def _template() -> str:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", return_hydra_config=True)
    return cfg.hydra.help.template


def test_every_option_has_a_one_line_description_written_in_its_yaml():
    missing = [f"{g}/{o}" for g in list(GROUPS) + ["experiment"] for o in options(g)
               if not describe(os.path.join(CONF, g, o + ".yaml"))]
    assert not missing, f"options without a first comment line: {missing}"


def test_help_template_lists_groups_options_descriptions_modes_presets_and_examples():
    text = _template()
    for group in GROUPS:
        assert f"\n{group}  ({group}=NAME, default " in text, group
        for o in options(group):
            desc = describe(os.path.join(CONF, group, o + ".yaml"))
            assert any(line.split() and line.split()[0] == o and line.rstrip().endswith(desc)
                       for line in text.splitlines()), (group, o)
    assert "+cluster=NAME" in text
    for mode in ("dry_run=true", "mode=plan", "tuning_stage=1", "tuning_stage=2", "tuning_stage=3", "sweep.objective"):
        assert mode in text, mode
    presets = text.split("== Experiment presets")[1].split("==")[1]
    for p in options("experiment"):
        assert p in presets
    examples = text.split("== Examples ==")[1].split("==")[0]
    assert sum(line.strip().startswith("python train.py") for line in examples.splitlines()) == 5
    assert "_schema" not in text and "schema/" not in text
    assert "$FLAGS_HELP" in text  # Hydra fills its own flags in


def test_generated_listings_have_no_schema_entries_and_escape_dollars():
    assert "schema" not in groups_text() + presets_text()
    for g in GROUPS:
        assert not [o for o in options(g) if o.startswith("_")]


def test_a_schema_is_not_an_option_of_its_group():
    with pytest.raises(MissingConfigException):
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            compose("config", overrides=["model=_schema"])


def test_quick_group_listing_applies_only_to_help_requests():
    assert quick_group_listing(["model=debug"]) is False


def test_no_config_sets_hydra_mode():
    """one_compose_per_run answers Hydra's mode look-up with None without composing: right only while no file in
    conf/ puts a value at hydra.mode (a file lands at its `# @package`, else at its group's path)."""
    import re

    import yaml
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    def keys(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from keys(v, f"{prefix}.{k}" if prefix else str(k))
        yield prefix

    landed = set()
    for root, _, files in os.walk(CONF):
        group = os.path.relpath(root, CONF).replace(os.sep, ".")
        for name in (f for f in files if f.endswith(".yaml")):
            with open(os.path.join(root, name)) as f:
                text = f.read()
            m = re.search(r"^#\s*@package\s+(\S+)", text, re.M)
            package = m.group(1) if m else ("" if group == "." else group)
            package = "" if package == "_global_" else package.replace("_group_", group)
            landed.update(keys(yaml.safe_load(text), package))
    assert "hydra.help.template" in landed and "hydra.launcher.partition" in landed  # the walk sees hydra's nodes
    assert "hydra.mode" not in landed
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):  # Hydra's own compose agrees (get_mode's)
        hydra = GlobalHydra.instance().hydra
        for overrides, mode in ((["experiment=llama2_7b_fp8"], None), (["hydra.mode=MULTIRUN"], RunMode.MULTIRUN)):
            cfg = hydra.compose_config("config", overrides, run_mode=RunMode.MULTIRUN, with_log_configuration=False,
                                       validate_sweep_overrides=False)
            assert cfg.hydra.mode == mode and cfg.model.name == ("llama2_7b" if mode is None else "debug")


def test_one_compose_per_run_answers_only_what_it_knows(monkeypatch):
    """Hydra's get_mode (a whole compose) is skipped for our configs; an override of hydra.mode or of a Hydra group,
    or configs from another dir, still get Hydra's answer."""
    from hydra._internal.hydra import Hydra

    asked = []
    monkeypatch.setattr(Hydra, "get_mode", lambda self, config_name, overrides: asked.append(overrides) or "composed")
    assert one_compose_per_run(["--config-dir", "elsewhere", "model=debug"]) is False
    assert one_compose_per_run(["--config-name=other"]) is False
    assert one_compose_per_run(["model=debug", "-m"]) is True
    assert one_compose_per_run(["model=debug"]) is False  # already in place
    assert Hydra.get_mode(None, "config", ["model=debug", "training.lr=1e-3,2e-3"]) is None and asked == []
    for o in (["hydra.mode=MULTIRUN"], ["+hydra.mode=RUN"], ["hydra/launcher=basic"], ["hydra=x"]):
        assert Hydra.get_mode(None, "config", o) == "composed"
    assert len(asked) == 4


@pytest.mark.e2e
def test_help_and_hydra_help_from_the_command_line():
    p = run_train(["--help"], timeout=120)
    assert p.returncode == 0, p.stdout
    assert "== Groups (group=option) ==" in p.stdout and "llama3_8b" in p.stdout and "_schema" not in p.stdout
    assert "--multirun,-m" in p.stdout  # Hydra's flags
    p = run_train(["--hydra-help"], timeout=120)
    assert p.returncode == 0, p.stdout
    assert "hydra/launcher: basic" in p.stdout and "hydra/sweeper:" in p.stdout
    p = run_train(["model=_schema", "dry_run=true"], timeout=120)
    assert p.returncode == exit_codes.BAD_CONFIG, p.stdout
    assert "model/_schema" in p.stdout
