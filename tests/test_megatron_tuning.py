"""GEMM tuning stage 3 with the megatron backend (primus/backends/megatron/tuned_gemm.py): megatron's linears (they
multiply with torch.matmul, not F.linear) reach the tuned executor for exactly the problems stage 1 recorded, forward,
dgrad and wgrad; losses equal the untuned run. On CPU a fake executor stands in for cuBLASLt (it answers with torch's
own GEMM and remembers what it was asked)."""
import pytest

from rank_script import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.skipif(__import__("importlib").util.find_spec("megatron") is None,
                                                    reason="megatron-core missing")]

SCRIPT = r'''
import json, os, sys
sys.path.insert(0, os.path.join(os.environ["PYTHONPATH"], "tests"))
from primus.backends.megatron.testing import run_steps
from tuning import apply
from tuning.results_file import append_row
from tuning.shapes import record_gemms
from tuning_fakes import FakeExecutor, cuda_row

tmp, mode = sys.argv[1], sys.argv[2]
overrides = ["model=debug", "training.seq_length=32", "training.micro_batch_size=2", "training.global_batch_size=2",
             "training.train_iters=2", "training.lr_warmup_iters=1", "device=cpu", "logging.tensorboard=false"]

out = {"rank": 0}
if mode == "record":
    with record_gemms(None) as rec:
        out["losses"] = run_steps(overrides, os.path.join(tmp, "rec"), steps=1)
    problems = rec.results()
    path = os.path.join(tmp, "results.txt")
    for p in problems:
        append_row(path, cuda_row(p), "cublasLt-130100")
    out["keys"] = sorted(str(p.tune_key()) for p in problems)
else:
    ex = FakeExecutor()
    handle = apply.install_tuned_linear(os.path.join(tmp, "results.txt"), executor=ex)
    out["losses"] = run_steps(overrides, os.path.join(tmp, "tuned"), steps=2)
    out["seen"] = sorted({str(k) for k in ex.seen})
    out["stats"] = handle.stats()
    handle.uninstall()
    out["plain"] = run_steps(overrides, os.path.join(tmp, "plain"), steps=2)
print("RESULT " + json.dumps(out), flush=True)
'''


def test_megatron_linears_reach_the_tuned_executor(tmp_path):
    rec = run_ranks(tmp_path, "tune.py", SCRIPT, ["record"])[0]
    tuned = run_ranks(tmp_path, "tune.py", SCRIPT, ["apply"])[0]
    assert rec["keys"] and tuned["seen"] == rec["keys"]  # every recorded problem (fwd, dgrad, wgrad) routed
    assert tuned["stats"]["tuned"] > 0
    assert tuned["losses"] == pytest.approx(tuned["plain"], abs=1e-6)
