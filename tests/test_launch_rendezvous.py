"""The local launcher's rendezvous reads launcher.master_addr / master_port (master_addr used to be read nowhere),
and leaves SIGTERM to the workers (forwarded by the launching process) instead of torch elastic's handler."""
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
