"""The guide's environment interface (primus/config/env.py): each exported variable sets its key, unless the config
set that key itself; either way the decision is reported."""
import pytest

from conftest import compose_cfg
from primus.config.env import ENV_KEYS, apply_env, describe, explicit_keys

# one case per variable of the table: (exported text, the key's value it gives)
CASES = {
    "PRIMUS_HIPBLASLT_TUNING": ("1", True),
    "PRIMUS_HIPBLASLT_TUNING_STAGE": ("3", 3),
    "HIPBLASLT_TUNING_OVERRIDE_FILE": ("/data/tune_hipblas_gemm_results.txt", "/data/tune_hipblas_gemm_results.txt"),
    "PRIMUS_DETERMINISTIC": ("1", True),
}


def value_of(cfg, key):
    group, name = key.split(".")
    return getattr(getattr(cfg, group), name)


def test_every_variable_of_the_table_has_a_case():
    assert set(CASES) == {e.var for e in ENV_KEYS}


@pytest.mark.parametrize("entry", ENV_KEYS, ids=lambda e: e.var)
def test_an_exported_variable_sets_its_key(entry):
    text, want = CASES[entry.var]
    cfg = compose_cfg([])
    decided, issues = apply_env(cfg, environ={entry.var: text})
    assert issues == [] and value_of(cfg, entry.key) == want
    assert decided == [{"var": entry.var, "value": text, "key": entry.key, "won": "env"}]
    assert entry.var in describe(decided[0]) and entry.key in describe(decided[0])


def test_the_guides_stage_3_command_gives_stage_3():
    """PRIMUS_HIPBLASLT_TUNING=1 PRIMUS_HIPBLASLT_TUNING_STAGE=3 python train.py ... (the guide, section 1)."""
    from primus.tuning_env import effective_stage

    cfg = compose_cfg([])
    apply_env(cfg, environ={"PRIMUS_HIPBLASLT_TUNING": "1", "PRIMUS_HIPBLASLT_TUNING_STAGE": "3"})
    assert effective_stage(cfg) == 3


def test_a_key_set_in_the_config_wins_and_the_decision_says_so():
    cfg = compose_cfg(["tuning_stage=1"])
    decided, _ = apply_env(cfg, explicit_keys(["tuning_stage=1"]), environ={"PRIMUS_HIPBLASLT_TUNING_STAGE": "3"})
    assert cfg.tuning.stage == 1
    assert decided[0]["won"] == "config" and "wins over the exported PRIMUS_HIPBLASLT_TUNING_STAGE=3" in \
        describe(decided[0])
    # given on the command line at its default value, the key still wins
    cfg = compose_cfg(["tuning.stage=0"])
    decided, _ = apply_env(cfg, explicit_keys(["tuning.stage=0"]), environ={"PRIMUS_HIPBLASLT_TUNING_STAGE": "2"})
    assert cfg.tuning.stage == 0 and decided[0]["won"] == "config"


@pytest.mark.parametrize("var,text", [("PRIMUS_HIPBLASLT_TUNING_STAGE", "4"), ("PRIMUS_DETERMINISTIC", "yes"),
                                      ("PRIMUS_HIPBLASLT_TUNING", "on")])
def test_an_exported_value_without_meaning_is_an_error(var, text):
    cfg = compose_cfg([])
    _, issues = apply_env(cfg, environ={var: text})
    [i] = issues
    assert var in i.keys and i.value == text and "export" in i.fix


def test_explicit_keys_reads_dotted_overrides_and_key_groups():
    assert explicit_keys(["model=debug", "+tuning.root=/x", "tuning_stage=2", "training.lr=1"]) == \
        frozenset({"tuning.root", "tuning.stage", "training.lr"})
