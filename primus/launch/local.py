"""Local multi-process launch from inside the Hydra job, through torch's elastic launch API.

Never torchrun around Hydra: every rank would compose its own output dir. Here the Hydra job composes once, then
starts `launcher.nproc_per_node` workers that share its run dir; rank 0 alone writes outputs.
"""
from __future__ import annotations

import os
import socket
import uuid
from typing import Any, Dict, Optional


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_process_env(port: Optional[int] = None) -> Dict[str, str]:
    """Rendezvous env for a world of one, so trainers can always initialise torch.distributed the same way."""
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port or free_port())}


def launch_local(cfg_yaml: str, run_dir: str, nproc: int, meta: Dict[str, Any], master_port: int = 0) -> Optional[Dict]:
    """Start nproc workers (primus.train_loop.worker) on this node and return rank 0's summary."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from primus.train_loop import worker

    port = master_port or free_port()
    lc = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"primus-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{port}",
        max_restarts=0,
        monitor_interval=0.5,
        start_method="spawn",
    )
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    results = elastic_launch(lc, worker)(cfg_yaml, run_dir, meta)
    return results.get(0)
