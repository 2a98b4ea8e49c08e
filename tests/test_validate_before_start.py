"""What a dry run must catch without a GPU and before any heavy import: an explicit checkpoint.resume path that is
not a checkpoint, and selective-recompute modules megatron-core does not have."""
import pytest

from primus.config.errors import ConfigError
from primus.config.validate import validate
from primus.context import RunContext


def _issues(cfg_of, overrides):
    with pytest.raises(ConfigError) as e:
        validate(cfg_of(overrides), RunContext(device="cuda", world_size=1, planned=True))
    return e.value.issues


def test_resume_path_that_is_not_a_checkpoint(cfg_of, tmp_path):
    (issue,) = _issues(cfg_of, [f"checkpoint.resume={tmp_path / 'nonexistent'}"])
    assert issue.keys == ["checkpoint.resume"] and "not a directory" in issue.rule and "auto" in issue.fix
    validate(cfg_of(["checkpoint.resume=auto"]), RunContext(device="cuda", world_size=1, planned=True))


def test_unknown_and_misplaced_recompute_modules(cfg_of):
    issues = _issues(cfg_of, ["recompute=selective", "recompute.recompute_modules=[core_attn,bogus,mla_up_proj]"])
    assert {tuple(i.keys) for i in issues} == {("recompute.recompute_modules",),
                                               ("recompute.recompute_modules", "model.multi_latent_attention")}
    bad = next(i for i in issues if i.keys == ["recompute.recompute_modules"])
    assert bad.value == ["bogus"] and "core_attn" in bad.fix
