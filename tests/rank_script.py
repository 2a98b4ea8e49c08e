"""Helpers for tests that run the trainers in subprocesses: train.py runs, and small rank scripts on 1..N ranks.

Timeouts catch a hang, not a slow run: `make test` runs one pytest-xdist worker per core, so a run that has two
cores to itself alone shares them there (interpreted Triton kernels, inductor's C++ builds: minutes)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIST_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def run_ranks(tmp_path, name, script, argv, nproc=1, timeout=600, expect=None):
    path = tmp_path / name
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=ROOT)
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
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **(extra_env or {}))
    p = subprocess.run([sys.executable, "train.py", f"hydra.run.dir={run_dir}", *argv], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    result_file = os.path.join(str(run_dir), "result.json")
    assert p.returncode == 0 and os.path.exists(result_file), p.stdout[-3000:] + p.stderr[-3000:]
    with open(result_file) as f:
        res = json.load(f)
    assert res["status"] == "ok", res.get("error")
    return res, p.stdout
