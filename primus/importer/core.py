"""Read a Primus experiment as Primus reads it and turn it into settings here (see keys.py for the key table)."""
from __future__ import annotations

import dataclasses
import enum
import functools
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from primus.importer import keys as K
from primus.importer import models as M
from primus.importer.primus_yaml import PrimusYamlError, deep_merge, parse, read_yaml

META_KEYS = ("work_group", "user_name", "exp_name", "workspace")
FRAMEWORKS = ("megatron", "torchtitan")
# MoE router settings are the model's (model.*) when they come from Primus's model config; an experiment that sets
# them overrides the model's (moe.*)
MODEL_ROUTER = ("moe_router_score_function", "moe_router_pre_softmax", "moe_router_load_balancing_type",
                "moe_aux_loss_coeff")


class NotPrimusExperiment(ValueError):
    """The file is not a Primus experiment (exit 2)."""


class CannotImport(ValueError):
    """A Primus experiment this project cannot run (an architecture, a framework, a missing model)."""


@dataclass
class Listed:
    key: str  # the Primus key (TorchTitan: section.key)
    value: Any
    source: str  # "experiment", "overrides", "model <file>", "module <file>"
    reason: str


@dataclass
class Imported:
    path: str
    framework: str
    model_name: str  # Primus's model name
    model_preset: str  # the preset here (existing or written)
    new_model: Optional[Dict[str, Any]] = None  # fields of a preset to write (model only in Primus's zoo)
    sets: Dict[str, Any] = field(default_factory=dict)  # key here -> value
    origin: Dict[str, str] = field(default_factory=dict)  # key here -> the Primus key it came from
    listed: List[Listed] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    overrides: List[str] = field(default_factory=list)  # the Primus keys the experiment's overrides set


# ------------------------------------------------------------------------------------------------ schema


def _schema_field(target: str):
    """(field type, has a default of None allowed) of a dotted key in the composed schema, or None if absent."""
    from primus.config.schema import PrimusConfig

    cls: Any = PrimusConfig
    parts = target.split(".")
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(cls):
            return None
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return None
        tp = hints[part]
        if i == len(parts) - 1:
            return tp
        cls = tp
    return None


def _optional(tp) -> bool:
    return type(None) in getattr(tp, "__args__", ())


def _enum_of(tp):
    for t in (tp,) + tuple(getattr(tp, "__args__", ())):
        if isinstance(t, type) and issubclass(t, enum.Enum):
            return t
    return None


def schema_problem(target: str, value: Any) -> Optional[str]:
    """Why `value` cannot be set at `target` here (None = it can, or the key is not in this build's schema)."""
    tp = _schema_field(target)
    if tp is None:
        return None
    if value is None:
        return None if _optional(tp) else "null is not allowed here"
    en = _enum_of(tp)
    if en is not None and str(value) not in {e.value for e in en}:
        return f"{value!r} is not one of {[e.value for e in en]}"
    return None


def missing_in_schema(targets) -> List[str]:
    return sorted(t for t in set(targets) if _schema_field(t) is None)


def unmapped_reason(key: str) -> str:
    """Why a Primus key the table has no entry for is not imported. Where a key here has the same name (the guide's
    names are kept), saying "no equivalent" would be wrong: the user is pointed at it instead."""
    from primus.config.keys import schema_leaves

    same = [k for k in schema_leaves() if k.rsplit(".", 1)[-1] == key]
    if same:
        return (f"not imported: the importer has no entry for it, though {' / '.join(same)} here has the same name; "
                f"if it means the same, set it by hand ({same[0]}=...)")
    return K.NO_EQUIV


# ------------------------------------------------------------------------------------------------ loading


def _flatten(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _check_experiment(path: str, raw: Any) -> None:
    shape = ("a Primus experiment is a mapping with work_group, user_name, exp_name, workspace and "
             "modules: {pre_trainer: {framework: megatron|torchtitan, config: pre_trainer.yaml, model: <name>.yaml, "
             "overrides: {...}}}")
    if not isinstance(raw, dict):
        raise NotPrimusExperiment(f"{path} is not a Primus experiment: it is not a YAML mapping ({shape})")
    if not isinstance(raw.get("modules"), dict) or not raw["modules"]:
        raise NotPrimusExperiment(f"{path} is not a Primus experiment: it has no `modules:` mapping ({shape})")
    missing = [k for k in META_KEYS if k not in raw]
    if missing:
        raise NotPrimusExperiment(f"{path} is not a Primus experiment: Primus requires {', '.join(missing)} "
                                  f"at the top level ({shape})")
    for name, mod in raw["modules"].items():
        if not isinstance(mod, dict) or "framework" not in mod:
            raise NotPrimusExperiment(f"{path} is not a Primus experiment: modules.{name} has no `framework:` "
                                      f"({shape})")


def _module(path: str, exp: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
    mods = exp["modules"]
    if "pre_trainer" in mods:
        return "pre_trainer", mods["pre_trainer"]
    names = ", ".join(mods)
    raise CannotImport(f"{path}: modules {names}: only pretraining (modules.pre_trainer) is imported; "
                       "post-training (SFT, LoRA) has no equivalent here")


def _load(root: Optional[str], kind: str, framework: str, name: str, what: str) -> Tuple[Dict[str, Any], str]:
    fn = name if str(name).endswith((".yaml", ".yml")) else f"{name}.yaml"
    path = os.path.join(root, "primus", "configs", kind, framework, fn)
    if not os.path.isfile(path):
        raise CannotImport(f"{what} {name!r}: {path} does not exist (is --primus-root a Primus checkout? it must hold "
                           f"primus/configs/{kind}/{framework}/)")
    return parse(path), path


def _apply(entry: K.Entry, key: str, value: Any, view: Dict[str, Any]) -> Dict[str, Any]:
    if isinstance(entry, str):
        if value is None and _schema_field(entry) is not None and not _optional(_schema_field(entry)):
            return {}  # Primus's null = the library default: ours applies
        return {entry: value}
    return entry.fn(value, view)


def _run_switches() -> Tuple[str, ...]:
    """Model fields that switch megatron's kernels rather than shape the model: a new preset leaves them to the
    experiment, so that the preset also builds on TorchTitan (which has none of them)."""
    from primus.features import model

    return tuple(f"model.{k}" for k in model.megatron_only(None) + ("cross_entropy_loss_fusion",))


def _model_fields(zoo: Dict[str, Any], table: Dict[str, K.Entry], name: str,
                  notes: Optional[List[str]] = None, run_context: Optional[int] = None) -> Dict[str, Any]:
    """A preset's fields from a Primus (megatron) model config: its model.* keys and its router settings. What the
    preset takes from elsewhere than Primus's config is appended to `notes`."""
    fields: Dict[str, Any] = {"name": name}
    for key, value in zoo.items():
        entry = table.get(key)
        if entry is None or isinstance(entry, K.No):
            continue
        try:
            got = _apply(entry, key, value, zoo)
        except ValueError as e:
            raise CannotImport(f"model {name}: {key}: {e}") from e
        for target, v in got.items():
            if target in _run_switches():
                continue
            if target.startswith("model.") and v is not None:
                fields[target[len("model."):]] = v
            elif key in MODEL_ROUTER and v is not None:
                fields[key] = v
    fields.setdefault("num_query_groups", fields.get("num_attention_heads"))
    if not zoo.get("group_query_attention", True) or fields.get("num_query_groups") is None:
        fields["num_query_groups"] = fields.get("num_attention_heads")
    tok = zoo.get("tokenizer_model")
    if "vocab_size" not in fields:
        if tok not in M.TOKENIZER_VOCAB:
            raise CannotImport(f"model {name}: its vocabulary comes from the tokenizer {tok!r}, whose size is not "
                               "known here: add it to primus/importer/models.py TOKENIZER_VOCAB, or give the model "
                               "config a vocab_size")
        fields["vocab_size"] = M.TOKENIZER_VOCAB[tok]
    if "num_experts" not in fields or not fields["num_experts"]:
        for k in ("num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
                  "moe_first_k_dense", "moe_layer_freq") + MODEL_ROUTER:
            fields.pop(k, None)
    if not fields.get("add_qkv_bias"):
        fields.pop("add_qkv_bias", None)  # the default here: only a model with q/k/v biases names them
    if not fields.get("multi_latent_attention"):
        for k in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
                  "rotary_scaling_factor", "original_max_position_embeddings", "mscale", "mscale_all_dim"):
            fields.pop(k, None)
        fields.pop("multi_latent_attention", None)
    if fields.get("max_position_embeddings") is None and name in M.PUBLISHED_CONTEXT:
        fields["max_position_embeddings"] = M.PUBLISHED_CONTEXT[name]
        if notes is not None:
            notes.append(f"model {name}: Primus's model config gives no max_position_embeddings; the preset takes the "
                         f"published context length, {M.PUBLISHED_CONTEXT[name]} (the experiment's own "
                         "max_position_embeddings, if it sets one, still applies to the run)")
    elif fields.get("max_position_embeddings") is None and run_context:
        fields["max_position_embeddings"] = run_context
        if notes is not None:
            notes.append(f"model {name}: Primus's model config gives no max_position_embeddings and the published "
                         f"context length is not known here; the preset takes the experiment's, {run_context} (set "
                         "max_position_embeddings in the preset for longer runs)")
    missing = [k for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                           "max_position_embeddings") if fields.get(k) is None]
    if missing:
        raise CannotImport(f"model {name}: Primus's model config gives no {', '.join(missing)}")
    return {k: fields[k] for k in _model_field_order() if k in fields}


def _model_field_order() -> List[str]:
    from primus.config.schema import ModelConfig

    return [f.name for f in dataclasses.fields(ModelConfig)] + [k for k in MODEL_ROUTER
                                                                 if k not in ModelConfig.__dataclass_fields__]


# ------------------------------------------------------------------------------------------------ import


def import_experiment(path: str, primus_root: Optional[str] = None, model_dir: str = M.CONF_MODEL_DIR) -> Imported:
    raw = read_yaml(path)
    _check_experiment(path, raw)
    try:
        exp = parse(path)
    except PrimusYamlError as e:
        raise CannotImport(str(e)) from e
    mod_name, mod = _module(path, exp)
    framework = mod.get("framework")
    if framework not in FRAMEWORKS:
        raise CannotImport(f"{path}: modules.{mod_name}.framework = {framework!r}: the backends here are megatron and "
                           "torchtitan")
    if "model" not in mod:
        raise NotPrimusExperiment(f"{path}: modules.{mod_name} names no `model:` (Primus needs config and model)")
    table = K.TABLES[framework]
    model_name = str(mod["model"])
    why = M.unsupported_family(model_name, framework)
    if why:
        raise CannotImport(f"model {model_name}: this project cannot build this architecture. Missing here: {why}")

    out = Imported(path=path, framework=framework, model_name=model_name, model_preset="")
    for k, v in exp.items():
        if k in ("modules", "name", "config_file"):
            continue
        entry = K.EXPERIMENT_KEYS.get(k, K.No(K.NO_EQUIV))
        out.listed.append(Listed(k, v, "experiment", entry.reason if isinstance(entry, K.No) else K.NO_EQUIV))
    for k, v in mod.items():
        if k not in ("framework", "config", "model", "overrides"):
            out.listed.append(Listed(f"modules.{mod_name}.{k}", v, "experiment", K.NO_EQUIV))

    # Primus's module base and model config (only with a Primus checkout)
    base, zoo, base_file, zoo_file = {}, {}, None, None
    if primus_root:
        base, base_file = _load(primus_root, "modules", framework, mod.get("config", "pre_trainer.yaml"),
                                "module config")
        zoo, zoo_file = _load(primus_root, "models", framework, model_name, "model")
    else:
        out.notes.append("Primus's module and model configs were not read (no --primus-root): only the experiment's "
                         "own keys are imported; Primus's defaults (its pre_trainer.yaml) do not come with them")

    preset = M.preset_for(model_name, model_dir)
    if framework == "torchtitan":
        tt_model = zoo.get("model", {}) if isinstance(zoo.get("model"), dict) else {}
        if preset is None:
            raise CannotImport(f"model {model_name} (TorchTitan {tt_model.get('name', '?')} flavor "
                               f"{tt_model.get('flavor', '?')}) has no preset here: add conf/model/"
                               f"{M.normalize(model_name)}.yaml with its sizes")
        zoo_flat = {f"model.{k}": v for k, v in tt_model.items()}
        zoo_flat.update({k: v for k, v in _flatten({k: v for k, v in zoo.items() if k != "model"}).items()})
        base_flat = _flatten(base)
        over_flat = _flatten(mod.get("overrides") or {})
    else:
        issues = M.architecture_issues(zoo)
        if issues:
            raise CannotImport(f"model {model_name}: this project cannot build this architecture. Missing here: "
                               + "; ".join(issues))
        zoo_flat, base_flat, over_flat = dict(zoo), dict(base), dict(mod.get("overrides") or {})
    if preset is None:
        if not zoo:
            raise CannotImport(f"model {model_name} has no preset here (conf/model/{M.normalize(model_name)}.yaml); "
                               "pass --primus-root <Primus checkout> to import it from Primus's model zoo")
        preset = M.normalize(model_name)
        out.new_model = _model_fields(zoo, table, preset, out.notes,
                                      (mod.get("overrides") or {}).get("max_position_embeddings"))
    out.model_preset = preset

    # Primus: the model's keys join the module's where the module has none; overrides come last
    view = dict(zoo_flat)
    view.update(base_flat)
    view = deep_merge(view, over_flat) if framework == "megatron" else {**view, **over_flat}
    source = {k: f"model {os.path.basename(zoo_file)}" for k in zoo_flat}
    source.update({k: f"module {os.path.basename(base_file)}" for k in base_flat})
    source.update({k: "overrides" for k in over_flat})
    out.overrides = list(over_flat)

    defaults_unmapped: Dict[str, List[str]] = {}
    givers: Dict[str, List[str]] = {}  # a setting here -> the Primus keys that gave it a value
    for key, value in view.items():
        src = source[key]
        if framework == "torchtitan" and key.startswith("model."):
            _torchtitan_model_key(out, key, value, src)
            continue
        entry = table.get(key)
        if entry is None and key.isupper():
            entry = K.ENV_LIKE
        from_model = src.startswith("model")
        if entry is None or isinstance(entry, K.No):
            reason = entry.reason if isinstance(entry, K.No) else unmapped_reason(key)
            if src == "overrides":
                out.listed.append(Listed(key, value, src, reason))
            else:  # a Primus default the experiment did not touch
                defaults_unmapped.setdefault(src, []).append(key)
            continue
        try:
            got = _apply(entry, key, value, view)
        except ValueError as e:
            if from_model and out.new_model is None:
                continue  # the preset here is the model; its differences are noted below
            out.listed.append(Listed(key, value, src, f"not importable: {e}"))
            continue
        if not got and src == "overrides":
            out.listed.append(Listed(key, value, src, entry.idle if isinstance(entry, K.Map) else
                                     "null in Primus: this project's default applies"))
        for target, v in got.items():
            if from_model and (target.startswith("model.") or key in MODEL_ROUTER) and not (
                    out.new_model is not None and target in _run_switches()):
                continue  # the model preset carries the model's own settings
            problem = schema_problem(target, v)
            if problem:
                out.listed.append(Listed(key, value, src, f"not importable as {target}: {problem}"))
                continue
            if target in out.sets and out.origin.get(target) != key and source.get(out.origin[target]) == "overrides" \
                    and src != "overrides":
                continue  # an override already decided it
            out.sets[target] = v
            out.origin[target] = key
            givers.setdefault(target, []).append(key)
    if not _is_moe(out, model_dir):
        _drop_moe_settings(out)
    for applies, settings, why in K.DERIVED:
        if applies(view):
            settings = settings(view) if callable(settings) else settings
            for target, v in settings.items():
                out.sets[target] = v
                out.origin[target] = why.split(":")[0]
            out.notes.append(f"set {', '.join(f'{k}={v}' for k, v in settings.items())}: {why}")
    stage = out.sets.get("turbo.turbo_sync_free_moe_stage") or 0
    if stage:
        # Primus's stage overrides its module's defaults for the stage's flags: here the stage sets them, and an
        # explicit false would contradict it, so a false that only a module default gave is left to the stage
        from primus.features.turbo import sync_free_components

        for target, _ in sync_free_components(int(stage)):
            key = out.origin.get(target)
            if out.sets.get(target) is False and key and source.get(key, "").startswith("module"):
                del out.sets[target]
                out.listed.append(Listed(key, False, source[key], f"set by turbo_sync_free_moe_stage={stage} "
                                                                  f"({target})"))
    if framework == "torchtitan" and _is_moe(out, model_dir) and "moe.moe_router_load_balancing_type" not in out.sets:
        # the model presets carry megatron's auxiliary balancing loss; TorchTitan 0.2.2's MoE has none (it balances
        # with an aux-loss-free expert bias), which is how Primus's TorchTitan examples train
        out.sets["moe.moe_router_load_balancing_type"] = "none"
        out.origin["moe.moe_router_load_balancing_type"] = "TorchTitan's MoE"
        out.notes.append("set moe.moe_router_load_balancing_type=none: TorchTitan 0.2.2's MoE balances with its "
                         "aux-loss-free expert bias, not an auxiliary loss")
    if framework == "torchtitan" and tt_model.get("name") == "llama3" and "model.use_rope_scaling" not in out.sets:
        # TorchTitan's llama3 model scales RoPE as Llama 3.1 does in every flavor (its RoPEScalingArgs default:
        # factor 8 over 8192 positions), so Primus's TorchTitan runs of Llama 3.x train with it
        out.sets.update({"model.use_rope_scaling": True, "model.rope_scaling_factor": 8.0})
        out.origin.update({"model.use_rope_scaling": "TorchTitan's llama3", "model.rope_scaling_factor":
                           "TorchTitan's llama3"})
        out.notes.append("set model.use_rope_scaling=true model.rope_scaling_factor=8.0: TorchTitan's llama3 model "
                         "applies Llama-3.1 RoPE scaling (factor 8 over 8192 positions) in every flavor, as Primus's "
                         "TorchTitan run does")
    if framework == "torchtitan" and "model.mtp_num_layers" not in out.sets and _preset_value(out, model_dir,
                                                                                                 "mtp_num_layers"):
        # TorchTitan 0.2.2's deepseek_v3 builds no multi-token-prediction layers, so Primus's TorchTitan runs of
        # a model whose preset here has them train without them
        depth = _preset_value(out, model_dir, "mtp_num_layers")
        out.sets["model.mtp_num_layers"] = 0
        out.origin["model.mtp_num_layers"] = "TorchTitan's deepseek_v3"
        out.notes.append(f"set model.mtp_num_layers=0: model={out.model_preset} has {depth} multi-token-prediction "
                         "layer(s); TorchTitan 0.2.2 builds none, so Primus's TorchTitan run trains without them")
    _drop_idle(out, view, source, givers, model_dir)
    for src, ks in defaults_unmapped.items():
        out.listed.append(Listed(", ".join(sorted(ks)), None, src,
                                 "Primus defaults with no equivalent here (this project's defaults apply)"))
    if zoo and out.new_model is None and framework == "megatron":
        out.notes += _preset_differences(zoo, table, preset, model_dir)
    return out


@functools.lru_cache(maxsize=None)
def _base_config(framework: str):
    """`python train.py backend=<framework>` composed once (Hydra's compose costs about a second)."""
    from hydra import compose, initialize_config_dir

    from primus.config.schema import register

    register()
    with initialize_config_dir(config_dir=os.path.dirname(M.CONF_MODEL_DIR), version_base="1.3"):
        return compose("config", overrides=[f"backend={framework}"])


def _config_of(out: Imported, model_dir: str):
    """The typed config `python train.py <this import>` composes (unvalidated); where it does not compose, a note
    says why and None (nothing is left out then: the dry run names what validation refuses)."""
    from omegaconf import OmegaConf

    from primus.config.schema import ModelConfig
    from primus.importer import write

    if out.new_model is not None:
        model = dict(out.new_model)
    else:
        model = read_yaml(M.preset_path(out.model_preset, model_dir)) or {}
    model = {k: v for k, v in model.items() if k in ModelConfig.__dataclass_fields__}
    try:
        merged = OmegaConf.merge(_base_config(out.framework), {"model": model}, write.nested(out.sets))
        return OmegaConf.to_object(merged)
    except Exception as e:  # noqa: BLE001 - a value the schema refuses: validation names it when the import is run
        out.notes.append(f"settings that act only under another were not left out: the imported config does not "
                         f"compose here ({type(e).__name__}: {str(e).splitlines()[0][:200]}); the dry run names them")
        return None


def _drop_idle(out: Imported, view: Dict[str, Any], source: Dict[str, str], givers: Dict[str, List[str]],
               model_dir: str) -> None:
    """Settings that act only under another setting (the features' ACTS_ONLY_WITH rows, judged on the config this
    import composes to) are left out: Primus's module defaults carry many of them for every run (a profiler window,
    delayed scaling's margin, Adam's betas under sgd). One the experiment itself sets is listed with what it needs."""
    from primus.features import idle_rows

    for _ in range(3):  # dropping one setting can idle another
        cfg = _config_of(out, model_dir)
        if cfg is None:
            return
        dropped = False
        for _feature, keys, need, _fix, _severity in idle_rows(cfg):
            for key in keys:
                primus_key = out.origin.get(key)
                if key not in out.sets or primus_key not in source:  # not imported, or set by the import itself
                    continue
                del out.sets[key], out.origin[key]
                dropped = True
                for k in givers.get(key, [primus_key]):
                    if source.get(k) == "overrides" and not any(x.key == k for x in out.listed):
                        out.listed.append(Listed(k, view.get(k), "overrides", f"no effect: acts only with {need}"))
        if not dropped:
            return


def _preset_value(out: Imported, model_dir: str, key: str) -> Any:
    import yaml

    if out.new_model is not None:
        return out.new_model.get(key)
    with open(M.preset_path(out.model_preset, model_dir)) as f:
        return (yaml.safe_load(f) or {}).get(key)


def _is_moe(out: Imported, model_dir: str) -> bool:
    import yaml

    if out.new_model is not None:
        return bool(out.new_model.get("num_experts"))
    with open(M.preset_path(out.model_preset, model_dir)) as f:
        return bool((yaml.safe_load(f) or {}).get("num_experts")) or bool(out.sets.get("model.num_experts"))


def _drop_moe_settings(out: Imported) -> None:
    """Primus ignores MoE settings on a dense model (its model bases set some for every model): they are listed, not
    set, so the run here is the dense run Primus makes."""
    from primus.features.turbo import flags

    moe_only = {f"turbo.{f}" for f in flags(moe_only=True)} | {"turbo.turbo_sync_free_moe_stage",
                                                                "turbo.turbo_deepep_num_cu",
                                                                "turbo.turbo_deepep_use_comm_stream"}
    for target in [t for t in out.sets if t.startswith("moe.") or t in moe_only]:
        v = out.sets.pop(target)
        key = out.origin.pop(target, target)
        from_overrides = key in out.overrides
        if not from_overrides and (v in (None, False, 0) or target == "moe.moe_token_dispatcher_type"):
            continue  # a Primus default that is off (or moot) on a dense model anyway
        out.listed.append(Listed(key, v, "overrides" if from_overrides else "Primus defaults",
                                 f"no effect: {out.model_preset} is dense (Primus ignores MoE settings there)"))


def _torchtitan_model_key(out: Imported, key: str, value: Any, src: str) -> None:
    if key == "model.converters":
        for conv in value or []:
            if conv == "quantize.linear.float8":
                out.sets.setdefault("precision.fp8", "hybrid")
                out.sets.setdefault("precision.fp8_recipe", "tensorwise")
                out.origin["precision.fp8"] = key
            elif conv == "quantize.linear.mx":
                out.sets["precision.fp8"] = "e4m3"
                out.sets["precision.fp8_recipe"] = "mxfp8"
                out.origin["precision.fp8"] = key
            elif conv == "primus_turbo":
                pass  # the primus_turbo.* switches decide what the converter does
            else:
                out.listed.append(Listed(key, conv, src, K.NO_EQUIV))
        return
    if key in ("model.name", "model.flavor"):
        return  # named by the model preset
    out.listed.append(Listed(key, value, src, "the model preset gives the model (" + K.NO_EQUIV + ")"))


def _preset_differences(zoo, table, preset, model_dir) -> List[str]:
    import yaml

    with open(M.preset_path(preset, model_dir)) as f:
        ours = yaml.safe_load(f) or {}
    try:
        theirs = _model_fields(zoo, table, preset)
    except CannotImport:
        return []
    theirs.setdefault("add_qkv_bias", False)  # a model config without q/k/v biases leaves it out
    diff = [f"{k}: Primus {theirs[k]!r}, here {ours[k]!r}" for k in theirs
            if k in ours and k != "name" and ours[k] != theirs[k]]
    return [f"model={preset} differs from Primus's {preset} config in " + "; ".join(diff)] if diff else []
