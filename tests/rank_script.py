"""Run a small trainer-driving script on 1..N local ranks and collect the JSON each rank prints after `RESULT `."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIST_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def run_ranks(tmp_path, name, script, argv, nproc=1, timeout=240):
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
    assert len(out) == nproc, p.stdout[-2000:]
    return sorted(out, key=lambda r: r["rank"])
