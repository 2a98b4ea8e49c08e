"""Workaround for an upstream Hydra gap, kept in one place.

Hydra 1.3 parses the override `tuning_stage=2` as the integer 2 and then refuses it as a config-group choice
("Config group override must be a string or a list. Got int"). The guide's stages are numbers, so we quote a bare
integer choice of a numeric-named group before Hydra sees it (`tuning_stage=2` -> `tuning_stage="2"`), for the
command line (train.py) and for the compose API (tests, tools) alike.
"""
import re
from typing import List

NUMERIC_GROUPS = ("tuning_stage",)
_BARE = re.compile(r"^(\+{0,2})(%s)=(-?\d+(?:,-?\d+)*)$" % "|".join(NUMERIC_GROUPS))


def quote_numeric_group_choices(overrides: List[str]) -> List[str]:
    out = []
    for o in overrides:
        m = _BARE.match(o)
        if m:
            prefix, group, values = m.groups()
            o = "%s%s=%s" % (prefix, group, ",".join('"%s"' % v for v in values.split(",")))
        out.append(o)
    return out


def is_saved_run_dir(argv: List[str]) -> bool:
    """True for `--config-dir <run>/.hydra --config-name config` (an exact rerun of a finished run).

    Hydra puts `--config-dir` after the app's own config dir in the search path, so `--config-name config` would
    find conf/config.yaml instead of the saved one. For a run's `.hydra` dir (it holds hydra.yaml and
    overrides.yaml beside config.yaml) train.py then composes from that dir alone; any other --config-dir (extra
    presets of a user) keeps conf/ first, as Hydra intends.
    """
    import os

    cdir = name = None
    for i, a in enumerate(argv):
        if a in ("--config-dir", "-cd") and i + 1 < len(argv):
            cdir = argv[i + 1]
        elif a.startswith("--config-dir="):
            cdir = a.split("=", 1)[1]
        elif a in ("--config-name", "-cn") and i + 1 < len(argv):
            name = argv[i + 1]
        elif a.startswith("--config-name="):
            name = a.split("=", 1)[1]
    return bool(cdir and name and all(os.path.isfile(os.path.join(cdir, f"{n}.yaml")) for n in (name, "hydra", "overrides")))


HELP_FLAGS = ("--help", "-h", "--hydra-help")


def quick_group_listing(argv: List[str]) -> bool:
    """Make Hydra 1.3's --help / --hydra-help list the config groups in well under a second. Returns whether it
    applied.

    Hydra's get_help() fills $APP_CONFIG_GROUPS and $HYDRA_CONFIG_GROUPS whatever the template uses, and each of
    the ~120 group-option look-ups behind them (ConfigLoaderImpl.get_group_options) deep-copies the whole config
    repository (ConfigStore with every group's schema) into a fresh CachingConfigRepository: 3 to 9 s of copying
    for a listing that reads the same repository every time. During a help request nothing is added to the
    repository, so one copy per (config name, overrides) serves every look-up. Only for the help flags; checked
    against hydra-core 1.3 (the method and its signature are looked up before rebinding; otherwise Hydra's own
    slow path runs)."""
    if not any(a in HELP_FLAGS for a in argv):
        return False
    import inspect

    import hydra
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    original = getattr(ConfigLoaderImpl, "get_group_options", None)
    if not hydra.__version__.startswith("1.3") or original is None or getattr(original, "_primus_quick", False):
        return False
    if list(inspect.signature(original).parameters) != ["self", "group_name", "results_filter", "config_name",
                                                         "overrides"]:
        return False
    from hydra.core.object_type import ObjectType

    repos: dict = {}

    def get_group_options(self, group_name, results_filter=ObjectType.CONFIG, config_name=None, overrides=None):
        key = (id(self), config_name, tuple(overrides or ()))
        if key not in repos:
            repos[key] = self._parse_overrides_and_create_caching_repo(config_name, list(overrides or ()))[1]
        return repos[key].get_group_options(group_name, results_filter)

    get_group_options._primus_quick = True
    ConfigLoaderImpl.get_group_options = get_group_options
    return True


CONFIG_SOURCE_FLAGS = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn")


def one_compose_per_run(argv: List[str]) -> bool:
    """Let `python train.py ...` compose its config once, not twice. Returns whether it applied.

    Hydra 1.3's `_run_hydra` calls `Hydra.get_mode` before every run or multirun: it composes the whole config
    (every defaults list, the structured schema) only to read `hydra.mode`, then `Hydra.run` / `Hydra.multirun`
    composes it again: 0.2-0.5 s of CPU per start (each start of a sweep point or a test run pays it). No file in
    conf/ sets `hydra.mode` (tests/test_help.py checks every one), so with our configs alone get_mode's answer is
    None, and Hydra then takes RUN, or MULTIRUN for -m, as it does for that None. The compose is skipped only
    then: not when an override names hydra.mode or a Hydra group (hydra/...), nor when --config-dir, --config-path
    or --config-name brings configs from elsewhere (they may set it). Checked against hydra-core 1.3 (the method
    and its signature are looked up before rebinding; otherwise Hydra's own path runs)."""
    if any(a.split("=", 1)[0] in CONFIG_SOURCE_FLAGS for a in argv):
        return False
    import inspect

    import hydra
    from hydra._internal.hydra import Hydra

    original = getattr(Hydra, "get_mode", None)
    if not hydra.__version__.startswith("1.3") or original is None or getattr(original, "_primus_once", False):
        return False
    if list(inspect.signature(original).parameters) != ["self", "config_name", "overrides"]:
        return False

    def get_mode(self, config_name, overrides):
        keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
        if any(k == "hydra" or k.startswith(("hydra.mode", "hydra/")) for k in keys):
            return original(self, config_name, overrides)
        return None

    get_mode._primus_once = True
    Hydra.get_mode = get_mode
    return True
