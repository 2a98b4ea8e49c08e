"""The local launcher's rendezvous reads launcher.master_addr / master_port (master_addr used to be read nowhere),
and leaves SIGTERM to the workers (forwarded by the launching process) instead of torch elastic's handler."""
import os
import subprocess
import sys

import pytest

from primus.launch import local


def test_rendezvous_endpoint_and_signals(monkeypatch):
    import torch.distributed.launcher.api as api

    seen = {}

    def fake_launch(lc, fn):
        seen["lc"] = lc
        return lambda *a: {0: {"status": "ok"}}

    monkeypatch.setattr(api, "elastic_launch", fake_launch)
    assert local.launch_local("", "/tmp", 2, {}, 29123, "10.0.0.5") == {"status": "ok"}
    lc = seen["lc"]
    assert lc.rdzv_endpoint == "10.0.0.5:29123" and lc.nproc_per_node == 2
    assert "SIGTERM" not in lc.signals_to_handle
    assert local.single_process_env(29123, "10.0.0.5")["MASTER_ADDR"] == "10.0.0.5"


def test_the_default_port_is_bound_by_the_store_itself_not_probed_beforehand(monkeypatch):
    """A port probed free and bound later can be taken in between by any socket on the host (EADDRINUSE at
    init_process_group under a busy test run): by default the store's server binds port 0 itself."""
    import torch.distributed.launcher.api as api

    seen = {}
    monkeypatch.setattr(api, "elastic_launch", lambda lc, fn: seen.update(lc=lc) or (lambda *a: {0: {}}))
    local.launch_local("", "/tmp", 2, {})
    assert seen["lc"].rdzv_endpoint == "127.0.0.1:0"
    assert local.single_process_env()["MASTER_PORT"] == "0"


@pytest.mark.e2e
def test_a_world_of_one_initialises_on_port_zero():
    code = ("import os, torch, torch.distributed as d\n"
            "from primus.launch.local import single_process_env\n"
            "os.environ.update(single_process_env())\n"
            "d.init_process_group('gloo'); t = torch.ones(1); d.all_reduce(t, group=d.new_group([0]))\n"
            "print(os.environ['MASTER_PORT'], d.get_world_size(), int(t.item()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "1", "1"]


def test_a_trainer_without_a_launcher_gets_a_world_of_one_and_a_launchers_values_win(monkeypatch):
    for k in local.single_process_env():
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MASTER_PORT", "29123")
    local.default_to_single_process()
    assert {k: os.environ[k] for k in local.single_process_env()} == {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29123"}
