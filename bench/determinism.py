"""Deterministic mode on the GPU: two runs with PRIMUS_DETERMINISTIC=1 and the same seed must give bitwise-equal
losses (and a third, non-deterministic run is reported for contrast).

    python bench/determinism.py [train.py overrides...]
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def losses(overrides, env):
    d = tempfile.mkdtemp(prefix="primus-det-")
    p = subprocess.run([sys.executable, "train.py", *overrides, f"hydra.run.dir={d}", "logging.tensorboard=false"],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    if p.returncode != 0:
        raise SystemExit(p.stdout[-2000:] + p.stderr[-3000:])
    with open(os.path.join(d, "result.json")) as f:
        return json.load(f)["losses"]


def main():
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        return
    over = sys.argv[1:] or ["model=llama3_2_1b", "training.seq_length=1024", "training.micro_batch_size=2",
                            "training.global_batch_size=4", "training.train_iters=8"]
    det = {"PRIMUS_DETERMINISTIC": "1"}
    a, b = losses(over, det), losses(over, det)
    c = losses(over, {})
    same = a == b
    print(json.dumps({"overrides": over, "deterministic_run_1": a, "deterministic_run_2": b,
                      "bitwise_identical": same, "non_deterministic_run": c,
                      "max_abs_diff_nondet_vs_det": max(abs(x - y) for x, y in zip(a, c))}, indent=1))
    print(f"| deterministic reruns bitwise identical | {same} | {len(a)} steps |")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
