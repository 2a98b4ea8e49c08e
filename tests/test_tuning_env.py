"""Tuning-stage semantics of the guide: the stage counts only with the switch on and deterministic mode off."""
import os

from conftest import compose_cfg
from primus.tuning_env import effective_stage, results_file, shape_dir, tuning_env


def test_stage_ignored_without_switch(monkeypatch):
    monkeypatch.delenv("PRIMUS_HIPBLASLT_TUNING", raising=False)
    cfg = compose_cfg(["tuning_stage=1"])
    assert effective_stage(cfg) == 0
    env = tuning_env(cfg, rocm=True)
    assert env["TE_HIPBLASLT_TUNING_RUN_COUNT"] == "0" and env["TE_HIPBLASLT_TUNING_ALGO_COUNT"] == "0"
    assert "HIPBLASLT_LOG_MASK" not in env


def test_switch_from_env(monkeypatch):
    monkeypatch.setenv("PRIMUS_HIPBLASLT_TUNING", "1")
    monkeypatch.delenv("PRIMUS_DETERMINISTIC", raising=False)
    assert effective_stage(compose_cfg(["tuning_stage=2"])) == 2


def test_deterministic_turns_tuning_off(monkeypatch):
    monkeypatch.setenv("PRIMUS_HIPBLASLT_TUNING", "1")
    monkeypatch.setenv("PRIMUS_DETERMINISTIC", "1")
    cfg = compose_cfg(["tuning_stage=1"])
    assert effective_stage(cfg) == 0 and tuning_env(cfg, rocm=True)["TE_HIPBLASLT_TUNING_RUN_COUNT"] == "0"


def test_stage1_rocm_dump_env_layout(monkeypatch):
    monkeypatch.delenv("PRIMUS_DETERMINISTIC", raising=False)
    cfg = compose_cfg(["tuning_stage=1", "tuning.enabled=true", "model=llama2_7b"])
    env = tuning_env(cfg, rocm=True, node_rank=3)
    assert env["HIPBLASLT_LOG_MASK"] == "32" and env["HIPBLASLT_TUNING_OVERRIDE_FILE"] == ""
    assert env["HIPBLASLT_LOG_FILE"].endswith("outputs/tune_hipblaslt/llama2_7b/gemm_shape/dump_hipblaslt_gemm_shape_3.txt")
    assert shape_dir(cfg) == os.path.join("outputs", "tune_hipblaslt", "llama2_7b", "gemm_shape")


def test_stage0_with_switch_uses_te_inprocess_tuning(monkeypatch):
    monkeypatch.delenv("PRIMUS_DETERMINISTIC", raising=False)
    env = tuning_env(compose_cfg(["tuning.enabled=true"]), rocm=True)
    assert (env["TE_HIPBLASLT_TUNING_RUN_COUNT"], env["TE_HIPBLASLT_TUNING_ALGO_COUNT"]) == ("10", "50")


def test_stage3_results_path_precedence(monkeypatch):
    monkeypatch.delenv("HIPBLASLT_TUNING_OVERRIDE_FILE", raising=False)
    cfg = compose_cfg(["tuning_stage=3", "model=llama2_7b"])
    assert results_file(cfg) == "outputs/tune_hipblaslt/llama2_7b/gemm_tune/tune_hipblas_gemm_results.txt"
    monkeypatch.setenv("HIPBLASLT_TUNING_OVERRIDE_FILE", "/env/file.txt")
    assert results_file(cfg) == "/env/file.txt"
    cfg.tuning.override_file = "/cfg/file.txt"
    assert results_file(cfg) == "/cfg/file.txt"
