"""Parameter counts match the published models; MFU formula and GPU peak detection."""
import pytest

from conftest import compose_cfg
from primus.context import RunContext
from primus.metrics.flops import flops_per_token, param_counts
from primus.metrics.meter import Meter
from primus.metrics.peaks import peak_tflops


@pytest.mark.parametrize("model,total_b", [
    ("llama2_7b", 6.738), ("llama3_8b", 8.030), ("llama3_70b", 70.554), ("llama3_2_1b", 1.236),
    ("mixtral_8x7b", 46.703), ("deepseek_v2_lite", 15.706), ("qwen3_30b_a3b", 30.532),
])
def test_total_params_match_published(model, total_b):
    assert param_counts(compose_cfg([f"model={model}"]).model).total / 1e9 == pytest.approx(total_b, abs=2e-3)


def test_reference_flops_formula_llama3_2_1b():
    # platform facts: N = 1.236e9 (tied embeddings: every parameter does a matmul), seq 4096
    m = compose_cfg(["model=llama3_2_1b"]).model
    n = param_counts(m).matmul_active
    assert n / 1e9 == pytest.approx(1.2357, abs=1e-3)
    assert flops_per_token(m, 4096) == pytest.approx(6 * n + 12 * 16 * 32 * 64 * 4096)
    # the causal convention (PaLM, TorchTitan) counts half the score matrix
    assert flops_per_token(m, 4096, causal=True) == pytest.approx(6 * n + 6 * 16 * 32 * 64 * 4096)


def test_moe_active_params_count_topk_only():
    m = compose_cfg(["model=mixtral_8x7b"]).model
    assert param_counts(m).matmul_active / 1e9 == pytest.approx(12.75, abs=0.05)


@pytest.mark.parametrize("name,peak", [("NVIDIA H200", 989.4), ("NVIDIA H100 80GB HBM3", 989.4),
                                       ("NVIDIA H100 PCIe", 756.0), ("AMD Instinct MI300X", 1307.4),
                                       ("AMD Instinct MI325X", 1307.4), ("AMD Instinct MI355X", 2516.6)])
def test_peak_detection(name, peak):
    assert peak_tflops(name)[0] == peak


def test_unknown_or_cpu_has_no_peak():
    assert peak_tflops(None) is None and peak_tflops("NVIDIA GeForce GTX 1080") is None


def test_meter_mfu_and_summary_exclude_warmup():
    cfg = compose_cfg(["model=llama3_2_1b", "training=bench", "training.timing_warmup_steps=2"])
    meter = Meter(cfg, RunContext(device="cpu", world_size=1, gpu_name="NVIDIA H200"))
    for i, t in enumerate([5.0, 4.0, 1.0, 1.0, 1.0]):
        meter.step(i + 1, 2.0, 1.0, 1e-4, t)
    s = meter.summary()
    assert s["timed_steps"] == 3 and s["step_time_s"]["median"] == 1.0
    tokens = 8 * 4096
    assert s["tokens_per_s"] == tokens
    assert s["mfu"] == pytest.approx(tokens * flops_per_token(cfg.model, 4096) / 989.4e12)
    assert s["mfu_causal"] == pytest.approx(tokens * flops_per_token(cfg.model, 4096, causal=True) / 989.4e12)
    assert s["mfu_causal"] < s["mfu"] and s["mfu_fp8_peak"] == pytest.approx(s["mfu"] * 989.4 / 1978.9)


def test_meter_splits_the_timed_steps_where_the_backend_times_their_parts():
    cfg = compose_cfg(["model=debug", "training.timing_warmup_steps=1"])
    meter = Meter(cfg, RunContext(device="cpu", world_size=1))
    for i, (t, fb, opt) in enumerate([(9.0, 8.0, 0.5), (2.0, 1.5, 0.25), (2.2, 1.5, 0.5), (2.0, 1.25, 0.5)]):
        meter.step(i + 1, 2.0, 1.0, 1e-4, t, phases={"forward_backward_s": fb, "optimizer_s": opt})
    split = meter.summary()["step_split_s"]  # the warm-up step (8 s of compilation) is not in it
    assert split["forward_backward_s"] == 1.5 and split["optimizer_s"] == 0.5
    assert split["other_s"] == pytest.approx(0.25)  # the median of the steps' rest: 0.25, 0.2, 0.25
    plain = Meter(cfg, RunContext(device="cpu", world_size=1))
    plain.step(1, 2.0, 1.0, 1e-4, 1.0)
    plain.step(2, 2.0, 1.0, 1e-4, 1.0)
    assert "step_split_s" not in plain.summary()  # a backend that does not time its parts gets no split
    assert "optimizer_split_s" not in meter.summary()  # nor an optimizer split where nothing is offloaded


def test_meter_gives_the_offloaded_optimizer_steps_parts_as_medians():
    cfg = compose_cfg(["model=debug", "training.timing_warmup_steps=1"])
    meter = Meter(cfg, RunContext(device="cpu", world_size=1))
    for i, (adam, wait) in enumerate([(5.0, 5.0), (0.5, 0.1), (0.7, 0.3), (0.6, 0.2)]):
        meter.step(i + 1, 2.0, 1.0, 1e-4, 2.0, phases={"forward_backward_s": 1.0, "optimizer_s": 1.0},
                   optimizer_split={"cpu_adam_s": adam, "d2h_wait_s": wait, "rest_s": 1.0 - adam - wait})
    s = meter.summary()
    assert s["optimizer_split_s"] == pytest.approx({"cpu_adam_s": 0.6, "d2h_wait_s": 0.2, "rest_s": 0.2})
    assert set(s["step_split_s"]) == {"forward_backward_s", "optimizer_s", "other_s"}  # parts are not phases
