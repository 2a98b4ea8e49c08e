"""The upstream workaround registries: every workaround listed with its pinned version, and what a version
mismatch does (message, apply or skip)."""
import logging

import pytest

from primus.backends.megatron.args import PINNED_MCORE
from primus.backends.torchtitan import PINNED_VERSION as PINNED_TORCHTITAN
from primus.patches import registry
from primus.patches.__main__ import all_workarounds
from primus.patches.registry import Conditions, Workaround, apply_all, pin, version_matches

ALL = all_workarounds()

EXPECTED = {
    "megatron.import.deferred_jit_fuser": ("megatron-core", PINNED_MCORE),
    "megatron.no_te.te_general_gemm_name": ("megatron-core", PINNED_MCORE),
    "megatron.no_te.mla_have_te": ("megatron-core", PINNED_MCORE),
    "megatron.optimizer.foreach_multi_tensor": ("megatron-core", PINNED_MCORE),
    "megatron.cpu.torch_proxy": ("megatron-core", PINNED_MCORE),
    "megatron.cpu.jit_helpers_eager": ("megatron-core", PINNED_MCORE),
    "megatron.cpu.rng_tracker": ("megatron-core", PINNED_MCORE),
    "megatron.cpu.moe_split_sizes": ("megatron-core", PINNED_MCORE),
    "megatron.cpu.tied_embedding_copy": ("megatron-core", PINNED_MCORE),
    "megatron.cpu.clip_grad_type_check": ("megatron-core", PINNED_MCORE),
    "megatron.cpu.optimizer_type_check": ("megatron-core", PINNED_MCORE),
    "megatron.compile.quiet_tp_group_lookup": ("megatron-core", PINNED_MCORE),
    "megatron.compile.moe_aux_loss_scale": ("megatron-core", PINNED_MCORE),
    "megatron.moe.grouped_gemm_fallback": ("megatron-core", PINNED_MCORE),
    "megatron.local.grad_accum_fusion": ("megatron-core", PINNED_MCORE),
    "torchtitan.import.deferred_hf_datasets": ("torchtitan", PINNED_TORCHTITAN),
    "torchtitan.import.deferred_attention_compile": ("torchtitan", PINNED_TORCHTITAN),
    "torchtitan.cpu.device_type": ("torchtitan", PINNED_TORCHTITAN),
    "torchtitan.cpu.memory_monitor": ("torchtitan", PINNED_TORCHTITAN),
    "torchtitan.cpu.pg_timeouts_barrier": ("torchtitan", PINNED_TORCHTITAN),
    "torchtitan.cpu.fsdp_sum_reduction": ("torchtitan", PINNED_TORCHTITAN),
    "torchtitan.cpu.moe_integer_histc": ("torchtitan", PINNED_TORCHTITAN),
    "torchtitan.cpu.peak_flops": ("torchtitan", PINNED_TORCHTITAN),
    "triton.rocm.buffer_store_clobber": ("triton", "3.6"),
    "torch.compile.cache_key_tag": ("torch", "2.13"),
    "torch.cpu.low_precision_gemm": ("torch", "2.13"),
    "triton.interpreter.scalar_index": ("numpy", "2.4"),
    "triton.interpreter.float_downcast": ("triton", "3.6"),
    "triton.interpreter.fp8_upcast": ("triton", "3.6"),
    "triton.interpreter.low_precision_dot": ("triton", "3.6"),
    "submitit.slurm.requeued_state": ("submitit", "1.5.4"),
}


@pytest.fixture
def fresh_registry(monkeypatch):
    """Nothing applied or warned yet in this process, as far as the registry knows (restored afterwards)."""
    monkeypatch.setattr(registry, "_APPLIED", set())
    monkeypatch.setattr(registry, "_WARNED", set())


def test_every_workaround_is_listed_with_its_pinned_version():
    """EXPECTED is the list: adding, removing or re-pinning a workaround shows up here (and in
    `python -m primus.patches`)."""
    assert len({w.name for w in ALL}) == len(ALL), "a workaround name is registered twice"
    rows = {r["name"]: r for r in registry.describe(ALL)}
    assert rows.keys() == EXPECTED.keys()
    assert all(r["pinned"] and r["installed"] for r in rows.values())
    for w in ALL:
        dist, version = EXPECTED[w.name]
        assert (dist, version) in [(d, v) for d, vs in w.pinned for v in vs], w.name
        assert w.upstream and w.problem and w.when, w.name
        assert w.on_mismatch in ("apply", "skip")
    # the backends' own pins, which the trainers and validation use, are the ones written against
    assert PINNED_MCORE == "0.16.1" and PINNED_TORCHTITAN == "0.2.2"


def test_the_pins_are_what_is_installed_here():
    """Upgrading a pinned package makes this fail: review each workaround against the new version."""
    for w in ALL:
        if w.name == "triton.rocm.buffer_store_clobber" and registry.installed_version("triton") is None:
            continue
        assert registry.mismatches(w) == [], w.name


def test_every_workaround_lives_in_a_patches_package():
    """Workarounds sit in the backends' patches packages or primus.patches; the features that also rebind upstream
    entry points (turbo swaps, fusions, fp8 / tuned-GEMM linears, compiled layers) stay in their feature modules."""
    homes = ("primus.backends.megatron.patches.", "primus.backends.torchtitan.patches.", "primus.patches")
    for w in ALL:
        assert w.fix.__module__.startswith(homes), (w.name, w.fix.__module__)
        assert w.name.split(".")[0] in ("megatron", "torchtitan", "torch", "triton", "submitit"), w.name


@pytest.mark.parametrize("installed, pinned, ok", [
    ("0.16.1", ("0.16.1",), True), ("0.16.10", ("0.16.1",), False), ("0.17.0", ("0.16.1",), False),
    ("2.13.0+cpu", ("2.11", "2.13"), True), ("2.11.0a0+git1234", ("2.11", "2.13"), True),
    ("2.12.1", ("2.11", "2.13"), False), (None, ("3.6",), False), ("3.6.0", ("3.6",), True),
])
def test_version_matching(installed, pinned, ok):
    assert version_matches(installed, pinned) is ok


def _fake_versions(monkeypatch, **versions):
    real = registry.installed_version
    monkeypatch.setattr(registry, "installed_version",
                        lambda dist: versions[dist] if dist in versions else real(dist))


def test_a_mismatch_is_named_and_still_applied(monkeypatch, caplog, fresh_registry):
    calls = []
    w = Workaround("megatron.test.example", "megatron.core.example.fn", "breaks on CPU",
                   (pin("megatron-core", "0.16.1"),), "device is CPU", lambda c: c.device == "cpu",
                   lambda c: calls.append(c.device) or "done")
    _fake_versions(monkeypatch, **{"megatron-core": "0.17.0"})
    caplog.set_level(logging.WARNING, logger="primus.patches")
    assert apply_all([w], Conditions(device="cpu")) == {"megatron.test.example": "done"}
    assert calls == ["cpu"]
    msgs = [r.getMessage() for r in caplog.records if r.name == "primus.patches"]
    assert len(msgs) == 1
    for part in ("megatron.test.example", "megatron-core: pinned 0.16.1, installed 0.17.0", "applied anyway",
                 "megatron.core.example.fn", "breaks on CPU"):
        assert part in msgs[0]
    # said once per process, applied once per process (every_run is off)
    assert apply_all([w], Conditions(device="cpu")) == {"megatron.test.example": None}
    assert calls == ["cpu"] and len([r for r in caplog.records if r.name == "primus.patches"]) == 1
    # not applicable: neither applied nor reported
    assert apply_all([w], Conditions(device="cuda")) == {}


def test_a_missing_package_counts_as_a_mismatch(monkeypatch, caplog, fresh_registry):
    w = Workaround("triton.test.example", "triton.compile", "miscompiles", (pin("triton", "3.6"),), "always",
                   lambda c: True, lambda c: True, every_run=True)
    _fake_versions(monkeypatch, triton=None)
    caplog.set_level(logging.WARNING, logger="primus.patches")
    apply_all([w], Conditions())
    assert "triton: pinned 3.6, installed none" in caplog.text


def test_an_unsafe_workaround_is_skipped_on_a_mismatch_and_says_why(monkeypatch, caplog, fresh_registry):
    """The real registry entry: megatron's TP-group lookup is only re-implemented against the pinned version."""
    from megatron.core.tensor_parallel import layers

    from primus.backends.megatron.patches import torch_compile

    (w,) = [w for w in torch_compile.WORKAROUNDS if w.name == "megatron.compile.quiet_tp_group_lookup"]
    assert w.on_mismatch == "skip"
    before = layers.get_tensor_model_parallel_group_if_none
    _fake_versions(monkeypatch, **{"megatron-core": "0.17.0"})
    caplog.set_level(logging.WARNING, logger="primus.patches")
    assert apply_all([w], Conditions(device="cpu", args={"compile": True})) == {}
    assert layers.get_tensor_model_parallel_group_if_none is before
    (msg,) = [r.getMessage() for r in caplog.records if r.name == "primus.patches"]
    assert "megatron.compile.quiet_tp_group_lookup" in msg and "pinned 0.16.1, installed 0.17.0" in msg
    assert "NOT applied" in msg and w.mismatch_note in msg


def test_a_skip_without_a_reason_is_refused():
    with pytest.raises(ValueError, match="mismatch_note"):
        Workaround("x.y.z", "u", "p", (pin("torch", "2.13"),), "always", lambda c: True, lambda c: None,
                   on_mismatch="skip")
    with pytest.raises(ValueError, match="on_mismatch"):
        Workaround("x.y.z", "u", "p", (pin("torch", "2.13"),), "always", lambda c: True, lambda c: None,
                   on_mismatch="maybe")


def test_the_listing_cli_names_every_workaround_and_flags_a_mismatch(monkeypatch, capsys):
    from primus.patches.__main__ import main

    assert main([]) == 0
    out = capsys.readouterr().out
    for w in ALL:
        assert w.name in out
    assert "[VERSION MISMATCH]" not in out and "pinned:      megatron-core 0.16.1" in out
    _fake_versions(monkeypatch, torchtitan="0.3.0")
    assert main([]) == 1
    out = capsys.readouterr().out
    assert "torchtitan.cpu.device_type  [VERSION MISMATCH]" in out and "installed:   torchtitan 0.3.0" in out
    assert main(["--bogus"]) == 2


def test_a_requeued_job_is_not_done_while_slurmctld_holds_it(monkeypatch):
    """submitit.slurm.requeued_state: a final state counts once it has held for REQUEUE_GRACE_S with slurmctld
    (scontrol) holding no live one. FAILED with the job PENDING again after its requeue is not done; FAILED in both
    is done only after the grace; so is a job slurmctld no longer knows; a state sacct calls unfinished is never
    asked about; a job that turns live again starts its grace afresh; no answer from slurmctld decides nothing
    until UNKNOWN_LIMIT_S."""
    import subprocess

    from submitit.slurm.slurm import SlurmInfoWatcher

    from primus.patches import submitit_requeue

    sacct = {"1": "FAILED", "2": "FAILED", "3": "FAILED", "4": "RUNNING", "5": "COMPLETED"}
    live = {"1": (0, "JobId=1 JobName=x JobState=PENDING Reason=BeginTime Restarts=1"),
            "2": (0, "JobId=2 JobName=x JobState=FAILED Reason=NonZeroExitCode Restarts=0"),
            "3": (1, "slurm_load_jobs error: Invalid job id specified"),
            "5": (0, "JobId=5 JobName=x JobState=COMPLETING Restarts=0")}
    asked, now = [], [100.0]

    def run(cmd, **kw):
        assert cmd[:4] == ["scontrol", "-o", "show", "job"]
        asked.append(cmd[4])
        rc, out = live[cmd[4]]
        return subprocess.CompletedProcess(cmd, rc, out if rc == 0 else "", "" if rc == 0 else out)

    monkeypatch.setattr(submitit_requeue.subprocess, "run", run)
    monkeypatch.setattr(submitit_requeue.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(submitit_requeue, "_FINAL_SINCE", {})
    monkeypatch.setattr(SlurmInfoWatcher, "get_state", lambda self, job_id, mode="standard": sacct[job_id])
    monkeypatch.setattr(SlurmInfoWatcher, "is_done", SlurmInfoWatcher.is_done)  # restored after the test
    assert submitit_requeue.install() and submitit_requeue.install()  # once: a second install wraps nothing more
    w = SlurmInfoWatcher()
    jobs = ("1", "2", "3", "4", "5")
    assert [w.is_done(j) for j in jobs] == [False] * 5  # 2 and 3 within their grace
    assert asked == ["1", "2", "3", "5"]
    now[0] += submitit_requeue.REQUEUE_GRACE_S
    assert [w.is_done(j) for j in jobs] == [False, True, True, False, False]
    # job 2 turns out requeued after all: pending again, then its next final state waits out a fresh grace
    live["2"] = (0, "JobId=2 JobName=x JobState=PENDING Restarts=1")
    assert not w.is_done("2")
    live["2"] = (0, "JobId=2 JobName=x JobState=FAILED Restarts=1")
    assert not w.is_done("2")
    now[0] += submitit_requeue.REQUEUE_GRACE_S
    assert w.is_done("2")
    assert submitit_requeue.live_state("1") == "PENDING" and submitit_requeue.live_state("3") == submitit_requeue.GONE
    # no answer from slurmctld (scontrol timed out or could not connect) decides nothing until UNKNOWN_LIMIT_S
    sacct["6"], live["6"] = "FAILED", (1, "slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
    assert submitit_requeue.live_state("6") is None
    assert not w.is_done("6")
    now[0] += submitit_requeue.REQUEUE_GRACE_S
    assert not w.is_done("6")
    live["6"] = (0, "JobId=6 JobName=x JobState=PENDING Restarts=1")  # the answer, once it comes, is the requeue
    assert not w.is_done("6") and "6" not in submitit_requeue._FINAL_SINCE
    live["6"] = (1, "slurm_load_jobs error: Socket timed out on send/recv operation")
    assert not w.is_done("6")
    now[0] += submitit_requeue.UNKNOWN_LIMIT_S
    assert w.is_done("6")  # slurmctld unreachable that long: sacct's FAILED stands
