"""The shared step loop's own guarantees, with a stand-in trainer (no backend, no subprocess)."""
import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from conftest import compose_cfg
from primus.context import RunContext


class _RaisingTrainer:
    """Runs one GEMM in its first step, notes whether a dispatch mode was recording it, then fails."""
    recording_seen = None

    def __init__(self, cfg, ctx):
        pass

    def setup(self):
        return {"params": 1}

    def train_step(self, step):
        torch.mm(torch.ones(2, 2), torch.ones(2, 2))
        _RaisingTrainer.recording_seen = _get_current_dispatch_mode() is not None
        raise RuntimeError("step failed")

    def close(self):
        pass


def test_a_failing_step_leaves_the_gemm_recording_mode_inactive(tmp_path, monkeypatch):
    import primus.backends
    from primus.train_loop import train

    monkeypatch.delenv("PRIMUS_DETERMINISTIC", raising=False)
    monkeypatch.setattr(primus.backends, "trainer_class", lambda cfg: _RaisingTrainer)
    monkeypatch.setattr("primus.train_loop.git_sha", lambda: None)  # no `git` process in a unit test
    cfg = compose_cfg(["tuning_stage=1", "tuning.enabled=true", f"tuning.root={tmp_path / 'tune'}", "device=cpu",
                       "logging.tensorboard=false"])
    ctx = RunContext(device="cpu", world_size=1, run_dir=str(tmp_path))
    assert _get_current_dispatch_mode() is None
    with pytest.raises(RuntimeError, match="step failed") as failure:
        train(cfg, ctx, {})
    assert _RaisingTrainer.recording_seen is True  # the step ran inside the recording (stage 1 on CPU)
    # the error is still held (as a caller that logs or re-raises it holds it): its traceback keeps train()'s frame,
    # and with it the recording, alive, so only an exit on the way out can have ended the mode
    assert failure.value is not None and _get_current_dispatch_mode() is None
