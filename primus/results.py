"""result.json: what a run was and what it measured. Written atomically (temp file + rename) by rank 0 only."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from importlib import metadata
from typing import Any, Dict, Optional

RESULT_FILE = "result.json"

PACKAGES = ("torch", "megatron-core", "torchtitan", "triton", "torchao", "transformer-engine", "primus-turbo",
            "hydra-core", "omegaconf", "submitit")

ENV_VARS = ("CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_NVLS_ENABLE", "TORCH_NCCL_AVOID_RECORD_STREAMS", "NCCL_ALGO",
            "PRIMUS_DETERMINISTIC", "PRIMUS_HIPBLASLT_TUNING", "PRIMUS_HIPBLASLT_TUNING_STAGE",
            "HIPBLASLT_TUNING_OVERRIDE_FILE", "HIPBLASLT_LOG_MASK", "HIPBLASLT_LOG_FILE", "TE_HIPBLASLT_TUNING_RUN_COUNT",
            "TE_HIPBLASLT_TUNING_ALGO_COUNT", "CUBLAS_WORKSPACE_CONFIG", "TORCH_COMPILE_CACHE_KEY_TAG",
            "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "OMP_NUM_THREADS", "WORLD_SIZE", "SLURM_JOB_ID")


def git_sha(repo: Optional[str] = None) -> Optional[str]:
    repo = repo or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        sha = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=5).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def package_versions() -> Dict[str, Optional[str]]:
    out = {}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def env_snapshot() -> Dict[str, str]:
    return {k: os.environ[k] for k in ENV_VARS if k in os.environ}


def write_json_atomic(path: str, data: Any) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


RESERVE_FILE = ".primus-reserve"
RESERVE_BYTES = 1 << 20  # a result.json is tens of KiB; a traceback and the autotune picks fit with room to spare


def reserve_space(run_dir: str) -> None:
    """Hold RESERVE_BYTES in the run dir for the run's result.json. A run that fills its disk (a checkpoint save,
    a profiler trace) would otherwise end with no result.json at all. Best effort: a disk already full gets none."""
    path = os.path.join(run_dir, RESERVE_FILE)
    try:
        os.makedirs(run_dir, exist_ok=True)
        with open(path, "wb") as f:
            f.write(b"\0" * RESERVE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        try:
            os.unlink(path)
        except OSError:
            pass


def write_result(run_dir: str, result: Dict[str, Any]) -> str:
    """Write result.json, first giving back the reserve. If even that fails, the result goes to stderr as JSON
    (the run's log keeps it) and the error is raised."""
    import sys

    try:
        os.unlink(os.path.join(run_dir, RESERVE_FILE))
    except OSError:
        pass
    path = os.path.join(run_dir, RESULT_FILE)
    try:
        write_json_atomic(path, result)
    except OSError as e:
        print(f"[primus] could not write {path} ({e}); the result follows as JSON:\n"
              + json.dumps(result, default=str), file=sys.stderr, flush=True)
        raise
    return path


def read_result(run_dir: str) -> Dict[str, Any]:
    with open(os.path.join(run_dir, RESULT_FILE)) as f:
        return json.load(f)


HYDRA_OWN = (".hydra", "train.log")  # what Hydra writes into a run dir before the job starts: config, job log


def discard_described_run(run_dir: str) -> bool:
    """Remove the run dir of a run that only described itself (dry run, mode=plan, a refused config): it printed
    everything it found and trained nothing, so outputs/runs keeps only runs that ran. Removed only while it holds
    nothing but Hydra's own files (a job dir with checkpoints or an earlier result.json stays). Returns whether
    it removed it."""
    import shutil

    try:
        names = os.listdir(run_dir)
    except OSError:
        return False
    if any(n not in HYDRA_OWN for n in names):
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return not os.path.exists(run_dir)
