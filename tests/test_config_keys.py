"""Every key of the composed config is a schema field (primus/config/keys.py): a `+key` typo stops the run with
the closest schema key, instead of being saved and read by nothing."""
import pytest

from primus.config.keys import unknown_keys


def test_typos_and_added_keys_are_named_with_the_closest_schema_key():
    issues = unknown_keys({"precison": "fp8", "training": {"micro_batch_szie": 2, "lr": 1e-3},
                           "launcher": {"env": {"ANY_NAME": "1"}}, "extra": {"note": "free-form"}})
    assert [i.keys for i in issues] == [["precison"], ["training.micro_batch_szie"]]
    assert "did you mean precision?" in issues[0].fix
    assert "did you mean training.micro_batch_size?" in issues[1].fix and "without '+'" in issues[1].fix


def test_a_key_put_under_the_wrong_group_points_to_where_it_lives():
    (issue,) = unknown_keys({"model": {"moe_token_dispatcher_typ": "flex"}})
    assert issue.keys == ["model.moe_token_dispatcher_typ"] and "moe.moe_token_dispatcher_type" in issue.fix


def test_the_default_config_has_no_unknown_key(cfg_of):
    from omegaconf import OmegaConf

    assert unknown_keys(OmegaConf.to_container(OmegaConf.structured(cfg_of([])))) == []


@pytest.mark.slow
def test_plus_key_typo_exits_2_before_anything_runs(tmp_path):
    from test_launch_common import run_train, tail

    p = run_train(["+precison=fp8", "dry_run=true", f"hydra.run.dir={tmp_path}"])
    assert p.returncode == 2, tail(p)
    assert "precison" in p.stdout and "did you mean precision?" in p.stdout


def test_a_switch_given_a_number_is_refused():
    from primus.config.keys import non_bool_overrides

    issues = non_bool_overrides(["precision.bf16=2", "precision.fp16=false", "+training.compile=True",
                                 "model.apply_rope_fusion=null", "model.apply_rope_fusion=1", "training.lr=1",
                                 "model=debug"])
    assert [(i.keys, i.value) for i in issues] == [(["precision.bf16"], "2"), (["model.apply_rope_fusion"], "1")]
    assert "precision.bf16=true or precision.bf16=false" in issues[0].fix and "(or null)" in issues[1].rule
