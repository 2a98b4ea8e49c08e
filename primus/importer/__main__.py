"""python -m primus.importer PRIMUS_EXPERIMENT.yaml [--primus-root DIR] [--out FILE]

Without --out: prints the Hydra overrides for train.py and the Primus keys with no setting here.
With --out conf/experiment/<name>.yaml: writes that experiment preset (and conf/model/<model>.yaml beside it when the
model exists only in Primus's model zoo). Exit 2: the file is not a Primus experiment; exit 1: it cannot be imported.
"""
from __future__ import annotations

import argparse
import os
import sys

from primus.importer.core import CannotImport, NotPrimusExperiment, import_experiment
from primus.importer.models import CONF_MODEL_DIR
from primus.importer.primus_yaml import PrimusYamlError
from primus.importer import write


def _model_dir(out: str) -> str:
    parent = os.path.dirname(os.path.abspath(out))
    if os.path.basename(parent) == "experiment":
        return os.path.join(os.path.dirname(parent), "model")
    return CONF_MODEL_DIR


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m primus.importer", description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment", help="a Primus experiment YAML (modules: pre_trainer: ...)")
    ap.add_argument("--primus-root", help="a Primus checkout: its model zoo and module configs are read from "
                                          "primus/configs/ (extends chains included)")
    ap.add_argument("--out", help="write the experiment preset here (conf/experiment/<name>.yaml); the model preset "
                                  "of a model only in Primus's zoo goes to the conf/model/ beside it")
    args = ap.parse_args(argv)
    model_dir = _model_dir(args.out) if args.out else CONF_MODEL_DIR
    try:
        imp = import_experiment(args.experiment, args.primus_root, model_dir=model_dir)
    except NotPrimusExperiment as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (CannotImport, PrimusYamlError) as e:
        print(f"error: cannot import: {e}", file=sys.stderr)
        return 1
    print(write.report(imp))
    if not args.out:
        print("\noverrides:\n  python train.py " + " ".join(write.overrides(imp)))
        if imp.new_model:
            print("\nmodel preset (conf/model/%s.yaml):\n%s" % (imp.model_preset, write.model_yaml(imp)))
        return 0
    name = os.path.splitext(os.path.basename(args.out))[0]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if imp.new_model:
        path = os.path.join(model_dir, imp.model_preset + ".yaml")
        os.makedirs(model_dir, exist_ok=True)
        with open(path, "w") as f:
            f.write(write.model_yaml(imp))
        print(f"wrote {path}")
    with open(args.out, "w") as f:
        f.write(write.experiment_yaml(imp, name))
    print(f"wrote {args.out}\ncheck it: python train.py experiment={name} dry_run=true")
    return 0


if __name__ == "__main__":
    sys.exit(main())
