"""Helpers for tests that run the trainers in subprocesses: train.py runs, and small rank scripts on 1..N ranks.

Timeouts catch a hang, not a slow run: `make test` runs one pytest-xdist worker per core, so a run that has two
cores to itself alone shares them there (interpreted Triton kernels, inductor's C++ builds: minutes)."""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from test_launch_common import DIST_ENV  # noqa: E402  (the rendezvous variables a child must not inherit)


def child_env(**extra):
    """This process's env for a child run: no rendezvous variables an in-process trainer left, one BLAS thread."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)
    return env


def run_ranks(tmp_path, name, script, argv, nproc=1, timeout=600, expect=None):
    path = tmp_path / name
    path.write_text(script)
    env = child_env(PYTHONPATH=ROOT)
    launch = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                  f"--nproc_per_node={nproc}"]
    p = subprocess.run([*launch, str(path), str(tmp_path), *argv], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    # ranks share one stdout: their lines can run together, so decode the object after every RESULT marker
    dec = json.JSONDecoder()
    out = [dec.raw_decode(chunk)[0] for chunk in p.stdout.split("RESULT ")[1:]]
    assert len(out) == (expect or nproc), p.stdout[-2000:]
    return sorted(out, key=lambda r: r["rank"])


def run_rank_configs(tmp_path, name, script, configs, nproc=1, timeout=600):
    """Several configurations in one launch (one interpreter start, one import of torch and the backend): `script`
    gets argv [dir, json list of override lists], runs each in dir/<i> and prints one RESULT per rank and config,
    with "config": i. Returns, per configuration, its ranks' results sorted by rank."""
    import json as _json

    out = run_ranks(tmp_path, name, script, [_json.dumps([list(c) for c in configs])], nproc, timeout,
                    expect=nproc * len(configs))
    return [sorted((r for r in out if r["config"] == i), key=lambda r: r["rank"]) for i in range(len(configs))]


def run_train(run_dir, argv, extra_env=None, timeout=600):
    """`python train.py hydra.run.dir=<run_dir> <argv>` on CPU, one thread; returns (result.json as dict, stdout)."""
    env = child_env(**(extra_env or {}))
    p = subprocess.run([sys.executable, "train.py", f"hydra.run.dir={run_dir}", *argv], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    result_file = os.path.join(str(run_dir), "result.json")
    assert p.returncode == 0 and os.path.exists(result_file), p.stdout[-3000:] + p.stderr[-3000:]
    with open(result_file) as f:
        res = json.load(f)
    assert res["status"] == "ok", res.get("error")
    return res, p.stdout


CONF = os.path.join(ROOT, "conf")


def _point_yaml(overrides):
    """A `# @package _global_` experiment file holding train.py's command-line overrides: group choices become
    defaults-list overrides, dotted keys nested values (YAML-typed as Hydra types command-line values)."""
    import yaml
    from hydra.core.override_parser.overrides_parser import OverridesParser

    groups, values = {}, {}  # a later choice of a group replaces an earlier one, as on the command line
    for o in OverridesParser.create().parse_overrides(list(overrides)):
        key, value = o.key_or_group, o.value()
        if "." not in key and os.path.isdir(os.path.join(CONF, key)):
            groups[key] = value
            continue
        node, parts = values, key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    defaults = [*({f"override /{k}": v} for k, v in groups.items()), "_self_"]
    return "# @package _global_\n" + yaml.safe_dump({"defaults": defaults, **values}, sort_keys=False)


def run_points(root, points, extra_env=None, timeout_per_point=600):
    """Several train.py runs in one process: a Hydra sweep over experiment files written under root/conf (one per
    point, from its override list), run one after the other by Hydra's basic launcher with one interpreter start
    and one import of torch and the backends; a point with launcher.nproc_per_node=2 launches its 2 ranks as a
    single run does. `points` maps a name to its overrides. Returns {name: (result.json or None, that point's
    stdout, the sweep's CompletedProcess)}, read through point(): a point that did not end "ok" fails only the
    tests that read it (its result.json has the error). The timeout is a single run's, per point."""
    conf = os.path.join(str(root), "conf", "experiment")
    os.makedirs(conf, exist_ok=True)
    names = list(points)
    for name in names:
        with open(os.path.join(conf, f"{name}.yaml"), "w") as f:
            f.write(_point_yaml(points[name]))
    sweep_dir = os.path.join(str(root), "sweep")
    env = child_env(**(extra_env or {}))
    p = subprocess.run([sys.executable, "train.py", "-m", f"hydra.sweep.dir={sweep_dir}",
                        f"hydra.searchpath=[file://{os.path.join(str(root), 'conf')}]",
                        "+hydra.callbacks.primus_sweep.plot=false", "experiment=" + ",".join(names)],
                       cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout_per_point * len(names))
    # each point's lines: from its "[sweep i/n] job k start:" line to the next one's
    starts = [(m.start(), int(m.group(1))) for m in re.finditer(r"^\[sweep \S+\] job (\d+) start: ", p.stdout, re.M)]
    assert [k for _, k in starts] == list(range(len(names))), p.stdout[-3000:] + p.stderr[-3000:]
    out = {}
    for i, name in enumerate(names):
        text = p.stdout[starts[i][0]:starts[i + 1][0] if i + 1 < len(names) else len(p.stdout)]
        result_file = os.path.join(sweep_dir, str(i), "result.json")
        res = None
        if os.path.exists(result_file):
            with open(result_file) as f:
                res = json.load(f)
        out[name] = (res, text, p)
    return out


def point(points, name):
    """One point of run_points, checked as run_train checks a single run: (result.json, stdout)."""
    res, text, p = points[name]
    assert res is not None and res["status"] == "ok", (res or {}).get("error") or (text[-3000:] + p.stderr[-3000:])
    return res, text
