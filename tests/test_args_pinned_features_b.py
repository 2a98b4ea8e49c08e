"""The backend argument dicts of a set of configs, pinned: moving a feature's mapping into its feature module
(primus/features/) must leave what megatron-core and TorchTitan receive unchanged, issues included.

The snapshots in tests/data/args_pinned_features_b.json were taken from the mappings as they stood before the move.
`python tests/test_args_pinned_features_b.py --write` retakes them (only for an intended change of the args).
"""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from conftest import compose_cfg  # noqa: E402
from primus.config.errors import ConfigError  # noqa: E402
from primus.config.validate import validate  # noqa: E402
from primus.context import RunContext  # noqa: E402

SNAPSHOTS = os.path.join(os.path.dirname(__file__), "data", "args_pinned_features_b.json")
CONF = os.path.join(os.path.dirname(__file__), "..", "conf")

CTXS = {
    "cpu1": RunContext(device="cpu", world_size=1, run_dir="/pinned/run"),
    "gpu8": RunContext(device="cuda", world_size=8, run_dir="/pinned/run", planned=True),
}

EXPERIMENTS = sorted(f[:-5] for f in os.listdir(os.path.join(CONF, "experiment")) if f.endswith(".yaml"))

# (overrides, context) per backend; each group's presets of the features this file pins
CASES = [
    ([], "cpu1"), (["model=debug_moe"], "cpu1"), ([], "gpu8"), (["model=debug_moe"], "gpu8"),
    *[([f"recompute={r}"], c) for r in ("none", "full", "selective", "layer_ids") for c in ("cpu1", "gpu8")],
    (["recompute=selective", "recompute.recompute_modules=[core_attn,mlp]"], "gpu8"),
    (["recompute=full", "recompute.recompute_method=block", "recompute.recompute_num_layers=1"], "gpu8"),
    (["recompute.activation_checkpoint_mode=selective", "recompute.selective_ac_option=2"], "gpu8"),
    *[([f"parallel={p}"], "gpu8") for p in ("default", "tp2", "pp2", "ep2")],
    (["parallel=ep2", "model=debug_moe"], "gpu8"),
    (["parallel=pp2", "parallel.virtual_pipeline_model_parallel_size=2"], "gpu8"),
    (["parallel.data_parallel_shard_degree=4", "parallel.data_parallel_replicate_degree=2"], "gpu8"),
    *[([f"memory={m}"], c) for m in ("default", "distributed_optimizer", "offload") for c in ("cpu1", "gpu8")],
    (["memory.enable_cpu_offload=true"], "gpu8"),
    *[([f"overlap={o}"], "gpu8") for o in ("default", "all")],
    (["overlap=all", "parallel=tp2", "parallel.sequence_parallel=true"], "gpu8"),
    (["overlap=all", "parallel=pp2", "parallel.virtual_pipeline_model_parallel_size=2"], "gpu8"),
    (["overlap.enable_async_tensor_parallel=true", "parallel=tp2", "training.compile=true"], "gpu8"),
    (["training=bench"], "gpu8"), (["training.optimizer=sgd", "training.clip_grad=0"], "cpu1"),
    (["training.lr_decay_style=constant", "training.deterministic=true"], "cpu1"),
    (["training.compile=true"], "gpu8"), (["tuning_stage=1"], "gpu8"),
    (["precision=fp8"], "gpu8"), (["precision=fp16"], "cpu1"), (["model=debug_moe", "moe=optimized"], "gpu8"),
    (["turbo=megatron", "backend.layer_spec=local"], "gpu8"),
    *[([f"experiment={e}"], "gpu8") for e in EXPERIMENTS],
]
BACKENDS = ("megatron", "torchtitan")


def _case_id(backend, overrides, ctx):
    return " ".join(([backend] if backend else []) + [ctx] + list(overrides))


def _take(backend, overrides, ctx):
    """(args, issues) as JSON-able data; for TorchTitan the issues its mapping collects too. backend None: the one
    the overrides choose (an experiment preset names its backend)."""
    cfg = compose_cfg(([f"backend={backend}"] if backend else []) + list(overrides))
    c = CTXS[ctx]
    if cfg.backend.name.value == "megatron":
        from primus.backends.megatron.args import build_args

        out = {"args": json.loads(json.dumps(build_args(cfg, c)))}
    else:
        from primus.backends.torchtitan.args import _map

        args, issues = _map(cfg, c)
        out = {"args": json.loads(json.dumps(args)), "issues": _issues(issues)}
    try:
        validate(cfg, c)
        found = []
    except ConfigError as e:
        found = e.issues
    out["validate"] = sorted(_issues(found))  # rules move between modules: their order may change
    return out


def _issues(issues):
    return [str(i) for i in issues]


def _cases():
    return [(None if any(o.startswith("experiment=") for o in overrides) else b, overrides, ctx)
            for b in BACKENDS for overrides, ctx in CASES
            if b == BACKENDS[0] or not any(o.startswith("experiment=") for o in overrides)]


@pytest.fixture(scope="module")
def snapshots():
    with open(SNAPSHOTS) as f:
        return json.load(f)


@pytest.mark.parametrize("backend, overrides, ctx", _cases(), ids=[_case_id(*c) for c in _cases()])
def test_args_unchanged(snapshots, backend, overrides, ctx):
    want, got = snapshots[_case_id(backend, overrides, ctx)], _take(backend, overrides, ctx)
    assert got["args"] == want["args"]
    # the issues, each exactly once; their order follows the modules that find them
    assert sorted(got.get("issues", [])) == sorted(want.get("issues", []))
    assert got["validate"] == want["validate"]


def test_every_case_is_pinned(snapshots):
    assert sorted(snapshots) == sorted(_case_id(*c) for c in _cases())


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    with open(SNAPSHOTS, "w") as f:
        f.write("{\n" + ",\n".join(json.dumps(_case_id(*c)) + ": " + json.dumps(_take(*c), sort_keys=True)
                                    for c in _cases()) + "\n}\n")
