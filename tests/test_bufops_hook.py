"""Compile hook with a fake triton.compile whose AMDGCN depends on the buffer-ops knob."""
import logging
import os
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.compiler
from triton import knobs

from primus.patches import apply_rocm_patches
from primus.patches import triton_bufops_hook as hook

HAZARD = """\t.amdgcn_target "amdgcn-amd-amdhsa--gfx942"
k:
\tbuffer_store_dwordx4 v[4:7], v1, s[8:11], 0 offen
\tv_mov_b32_e32 v5, 0
\ts_endpgm
"""
SAFE = """\t.amdgcn_target "amdgcn-amd-amdhsa--gfx942"
k:
\tglobal_store_dwordx4 v[2:3], v[4:7], off
\tv_mov_b32_e32 v5, 0
\ts_endpgm
"""


class FakeCompile:
    """Stands in for triton.compile: 'bad' kernels are hazardous only while buffer ops are on."""

    def __init__(self, knob_in_key=True):
        self.calls = []
        self.knob_in_key = knob_in_key

    def __call__(self, src, target=None, options=None, _env_vars=None):
        bufops = knobs.amd.use_buffer_ops
        self.calls.append(dict(src=src, bufops=bufops, env=os.environ.get("AMDGCN_USE_BUFFER_OPS"),
                               env_vars=_env_vars, always=knobs.compilation.always_compile))
        backend = getattr(target, "backend", "hip")
        hazardous = src == "stubborn" or (src == "bad" and bufops)
        if backend == "cuda":
            asm = {"ptx": "st.global.v4.f32", "cubin": b""}
        else:
            asm = {"amdgcn": HAZARD if hazardous else SAFE, "hsaco": b""}
        key = f"{src}-{bufops}" if self.knob_in_key else src
        return SimpleNamespace(asm=asm, hash=key, bufops=bufops,
                               metadata=SimpleNamespace(name=f"triton_{src}", target=target))


HIP = SimpleNamespace(backend="hip", arch="gfx942", warp_size=64)
CUDA = SimpleNamespace(backend="cuda", arch=90, warp_size=32)


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(hook, "counters", {"scanned": 0, "patched": 0, "residual": 0})
    monkeypatch.setattr(hook, "_logged", set())
    monkeypatch.delenv("AMDGCN_USE_BUFFER_OPS", raising=False)
    knobs.amd.reset()
    yield
    knobs.amd.reset()


def test_only_hazardous_kernel_recompiled_and_knob_restored():
    fake = FakeCompile()
    compile = hook.wrap_compile(fake)

    clean = compile("clean", target=HIP, options={})
    assert [c["src"] for c in fake.calls] == ["clean"]
    assert clean.bufops is True

    fixed = compile("bad", target=HIP, options={})
    assert [(c["src"], c["bufops"], c["env"]) for c in fake.calls[1:]] == [
        ("bad", True, None), ("bad", False, "0")]
    assert fixed.bufops is False and fixed.asm["amdgcn"] is SAFE
    # scoped to that one recompile
    assert knobs.amd.use_buffer_ops is True
    assert "AMDGCN_USE_BUFFER_OPS" not in os.environ
    assert compile("clean2", target=HIP).bufops is True
    assert hook.counters == {"scanned": 3, "patched": 1, "residual": 0}


def test_knob_restored_when_recompile_fails():
    def compile_fn(src, target=None, options=None):
        if not knobs.amd.use_buffer_ops:
            raise RuntimeError("boom")
        return FakeCompile()(src, target=target)

    with pytest.raises(RuntimeError, match="boom"):
        hook.wrap_compile(compile_fn)("bad", target=HIP)
    assert knobs.amd.use_buffer_ops is True
    assert "AMDGCN_USE_BUFFER_OPS" not in os.environ


def test_precomputed_env_vars_get_the_knob():
    # The async JIT path passes _env_vars itself; without the knob in them the key would not change.
    fake = FakeCompile()
    hook.wrap_compile(fake)("bad", target=HIP, options={}, _env_vars={"TRITON_X": "1"})
    assert fake.calls[0]["env_vars"] == {"TRITON_X": "1"}
    # same spelling triton's own key uses for the live knob
    assert fake.calls[1]["env_vars"] == {"TRITON_X": "1", "AMDGCN_USE_BUFFER_OPS": "false"}


def test_same_cache_key_forces_a_fresh_compile():
    fake = FakeCompile(knob_in_key=False)
    hook.wrap_compile(fake)("bad", target=HIP)
    assert [(c["bufops"], c["always"]) for c in fake.calls] == [(True, False), (False, False), (False, True)]
    assert knobs.compilation.always_compile is False


def test_residual_counted_and_warned(caplog):
    caplog.set_level(logging.INFO, logger="primus.patches.bufops")
    hook.wrap_compile(FakeCompile())("stubborn", target=HIP)
    assert hook.counters == {"scanned": 1, "patched": 1, "residual": 1}
    (rec,) = caplog.records
    assert rec.levelno == logging.WARNING and "triton_stubborn" in rec.getMessage()
    assert "1 hazard(s) remain" in rec.getMessage()


def test_logged_once_per_kernel(caplog):
    caplog.set_level(logging.INFO, logger="primus.patches.bufops")
    compile = hook.wrap_compile(FakeCompile())
    for _ in range(3):  # e.g. autotuning configs of one kernel
        compile("bad", target=HIP)
    compile("clean", target=HIP)
    msgs = [r.getMessage() for r in caplog.records if r.name == "primus.patches.bufops"]
    assert len(msgs) == 1
    assert "kernel triton_bad" in msgs[0] and "v_mov_b32_e32 v5, 0" in msgs[0]
    assert hook.counters["patched"] == 3


def test_non_hip_kernel_untouched():
    fake = FakeCompile()
    out = hook.wrap_compile(fake)("bad", target=CUDA)
    assert len(fake.calls) == 1 and "ptx" in out.asm
    assert hook.counters["scanned"] == 0


@pytest.fixture
def patchable(monkeypatch):
    import torch._inductor.async_compile as ac
    import torch.compiler.config as cconfig

    fake = FakeCompile()
    monkeypatch.setattr(triton, "compile", fake)
    monkeypatch.setattr(triton.compiler, "compile", fake)
    monkeypatch.setattr(ac, "_worker_compile_triton", ac._worker_compile_triton)
    monkeypatch.setenv("TORCH_COMPILE_CACHE_KEY_TAG", "user-tag")
    # torch's config object does not survive monkeypatch's undo (it deletes the key), so by hand
    old = cconfig.cache_key_tag
    cconfig.cache_key_tag = "user-tag"
    yield fake, ac, cconfig
    cconfig.cache_key_tag = old


def test_noop_off_rocm(monkeypatch, patchable):
    fake, ac, cconfig = patchable
    monkeypatch.setattr(torch.version, "hip", None)
    assert apply_rocm_patches() is False
    assert triton.compile is fake and triton.compiler.compile is fake
    assert os.environ["TORCH_COMPILE_CACHE_KEY_TAG"] == "user-tag"
    assert cconfig.cache_key_tag == "user-tag"
    assert ac._worker_compile_triton is not hook._worker_compile_triton


def test_install_on_rocm_is_idempotent(monkeypatch, patchable):
    fake, ac, cconfig = patchable
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    assert hook.install() is True
    first = triton.compile
    assert apply_rocm_patches() is True
    assert triton.compile is first and first.__wrapped__ is fake
    assert triton.compiler.compile.__wrapped__ is fake
    assert os.environ["TORCH_COMPILE_CACHE_KEY_TAG"] == "user-tag,primus-bufops-v1"
    assert cconfig.cache_key_tag == "user-tag,primus-bufops-v1"
    assert ac._worker_compile_triton is hook._worker_compile_triton
    # the installed hook really routes through the analyzer
    assert triton.compile("bad", target=HIP).bufops is False
    assert [c["bufops"] for c in fake.calls] == [True, False]


def test_real_triton_folds_knob_into_cache_key():
    # Guards the assumption _recompile relies on (triton 3.6): the knob reaches the cache key.
    from triton._C.libtriton import get_cache_invalidating_env_vars

    with knobs.amd.scope():
        knobs.amd.use_buffer_ops = False
        assert get_cache_invalidating_env_vars().get("AMDGCN_USE_BUFFER_OPS") == "false"
    assert "AMDGCN_USE_BUFFER_OPS" not in get_cache_invalidating_env_vars()


def _run_path_sees_hook(monkeypatch, tmp_path, fake):
    """Whether triton.compile is already routed through the hook when the backend starts building."""
    from conftest import run_path_to_setup

    return run_path_to_setup(monkeypatch, tmp_path, lambda: {
        "wrapped": getattr(triton.compile, "__wrapped__", None) is fake,
        "jit_wrapped": getattr(triton.compiler.compile, "__wrapped__", None) is fake})


@pytest.mark.e2e  # the real run path, up to the trainer's construction
def test_run_path_installs_the_hook_on_rocm_before_the_trainer_builds(monkeypatch, patchable, tmp_path):
    fake, ac, _ = patchable
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    assert _run_path_sees_hook(monkeypatch, tmp_path, fake) == {"wrapped": True, "jit_wrapped": True}
    assert ac._worker_compile_triton is hook._worker_compile_triton


@pytest.mark.e2e  # the real run path, up to the trainer's construction
def test_run_path_leaves_triton_alone_off_rocm(monkeypatch, patchable, tmp_path):
    fake, ac, _ = patchable
    monkeypatch.setattr(torch.version, "hip", None)
    assert _run_path_sees_hook(monkeypatch, tmp_path, fake) == {"wrapped": False, "jit_wrapped": False}
    assert triton.compile is fake
