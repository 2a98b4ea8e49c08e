"""Triton's front end (Python AST -> TTIR) for an sm90 target, on the CPU: catches what the interpreter does not;
and the Gluon kernel (fp8_cast_gluon) compiled to sm90 SASS, which the interpreter cannot run at all.

The CPU tests run the kernels through TRITON_INTERPRET=1, which executes them as Python: a name set to different
types in the two branches of a runtime `if` (bf16 in one, fp32 in the other) runs there but does not compile for a
GPU. tests/frontend_compile.py compiles the front end of the kernels (the fp8 casts, RMSNorm, RoPE: every config of
the autotuned spaces, every constexpr combination the wrappers launch) without a GPU, in its own process (no
interpreter).
"""
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("frontend_compile")]  # one compile of the scripts

pytest.importorskip("triton")

HERE = os.path.dirname(os.path.abspath(__file__))


def _script(name: str) -> dict:
    """The JSON object a compile script of tests/ prints, run in its own process without the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, os.path.join(HERE, name)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def results():
    return _script("frontend_compile.py")


def test_the_check_rejects_mismatched_branch_types(results):
    assert "Mismatched type" in results.pop("mismatched branch types (must fail)")


def test_every_kernel_config_compiles_for_sm90(results):
    results = {k: v for k, v in results.items() if not k.startswith("mismatched")}
    assert len(results) >= 39  # distinct constexpr sets (num_warps does not change the TTIR)
    bad = {k: v for k, v in results.items() if v != "ok"}
    assert not bad, bad


@pytest.fixture(scope="module")
def gluon():
    pytest.importorskip("triton.experimental.gluon")
    return _script("gluon_compile.py")


def test_gluon_cast_transposes_in_registers_for_sm90(gluon):
    """fp8_cast_gluon's kernel, compiled to sm90 SASS on the CPU for each input / fp8 type it serves: no spill, no
    byte-wide shared-memory traffic (the Triton control has 64 LDS.U8 per thread: its transpose) and fewer
    instructions per thread than that control."""
    control = gluon.pop("triton control")
    assert isinstance(control, dict), control
    assert control["lds_u8"] >= 32
    assert len(gluon) == 4
    for case, r in gluon.items():
        assert isinstance(r, dict), (case, r)
        assert r["stack"] == 0 and r["lds_u8"] == 0, (case, r)
        assert r["regs"] <= 128, (case, r)  # 2 CTAs of 8 warps per SM: 2 x 256 x 128 = the 65,536 registers
        assert r["instructions"] < 0.8 * control["instructions"], (case, r, control)
