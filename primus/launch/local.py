"""Local multi-process launch from inside the Hydra job, through torch's elastic launch API.

Never torchrun around Hydra: every rank would compose its own output dir. Here the Hydra job composes once, then
starts `launcher.nproc_per_node` workers that share its run dir; rank 0 alone writes outputs.
"""
from __future__ import annotations

import contextlib
import os
import signal
import uuid
from typing import Any, Dict, Optional


# Port 0 lets the store's server bind whatever port the kernel hands it at bind time. Probing a free port first and
# binding it later races with every other socket on the host (an outgoing connection's ephemeral port can take it in
# between: EADDRINUSE at init_process_group). Only the server needs the number: a world of one has no other rank, and
# the elastic agent's workers get the port of the store it shares with them from the agent itself.
ANY_PORT = 0


def single_process_env(port: Optional[int] = None, addr: str = "127.0.0.1") -> Dict[str, str]:
    """Rendezvous env for a world of one, so trainers can always initialise torch.distributed the same way."""
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": addr, "MASTER_PORT": str(port or ANY_PORT)}


def default_to_single_process() -> None:
    """A trainer started without a launcher is a world of one: fill in the rendezvous env it lacks (what a launcher
    set wins)."""
    for k, v in single_process_env().items():
        os.environ.setdefault(k, v)


def launch_local(cfg_yaml: str, run_dir: str, nproc: int, meta: Dict[str, Any], master_port: int = 0,
                 master_addr: str = "127.0.0.1") -> Optional[Dict]:
    """Start nproc workers (primus.train_loop.worker) on this node and return rank 0's summary. The rendezvous
    is launcher.master_addr:launcher.master_port (this host's loopback and any free port by default)."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from primus.train_loop import worker

    port = master_port or ANY_PORT
    lc = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"primus-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"{master_addr}:{port}",
        max_restarts=0,
        monitor_interval=0.5,
        start_method="spawn",
        # SIGTERM is forwarded to the workers (forward_preemption_signals), not turned into a SignalException
        signals_to_handle="SIGINT,SIGHUP,SIGQUIT",
    )
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    with forward_preemption_signals():
        results = elastic_launch(lc, worker)(cfg_yaml, run_dir, meta)
    return results.get(0)


PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@contextlib.contextmanager
def forward_preemption_signals():
    """A preemption signal sent to this launching process goes to the workers, which finish their step,
    checkpoint and end as `preempted` (primus/preemption.py); this process then waits for them and exits with the
    preempted code like a single-process run. torch elastic would otherwise turn SIGTERM into a SignalException
    here (exit 1 with a traceback) and kill the workers mid-step: the launch config tells it to leave SIGTERM
    alone."""

    def forward(signum, frame):
        import psutil

        for child in psutil.Process().children():
            try:
                if "spawn_main" in " ".join(child.cmdline()):  # the workers, not multiprocessing's helpers
                    child.send_signal(signum)
            except psutil.Error:
                pass

    saved = {s: signal.signal(s, forward) for s in PREEMPTION_SIGNALS}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
