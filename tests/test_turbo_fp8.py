"""fp8 linear: Triton cast kernels (tensorwise / rowwise / blockwise) and the fp8 linear fwd + bwd vs float64.

fp8 band: e4m3 keeps 3 mantissa bits, so each quantised operand carries ~2^-4/sqrt(3) ~ 3.6% RMS relative
rounding error; a product of two such operands, summed over K, lands at ||out-ref||/||ref|| ~ 4-6%. e5m2 (2 bits,
gradients under "hybrid") doubles it. Bands: 0.08 (e4m3), 0.15 (hybrid grads). A wrong scale, transpose or pad
gives errors of order 1, far outside. The forward is also checked tightly against an exact emulation (the same
quantisation done in float64 torch): it must match to bf16 output rounding.
On CPU the GEMMs are torch._scaled_mm's CPU kernels and the cast/blockwise kernels run in Triton's interpreter.
Blockwise GEMMs: torch.nn.functional.scaled_mm (cuBLASLt) on a CUDA sm90 GPU, else the Triton GEMM. CPU cannot run
the former: here its layout rules (PyTorch's checks, in Python) are applied to every GEMM the linear makes; the GPU
tests run it (vs float64, vs an exact emulation, vs the Triton GEMM).
"""
import pytest
import torch

from turbo_util import DEV, relerr  # noqa: I001
from primus.turbo import fp8_linear as F8

E4 = torch.float8_e4m3fn


def _emul_tensorwise(t):
    t = t.double()
    s = 448.0 / t.abs().max().clamp_min(1e-12)
    return (t * s).clamp(-448, 448).to(E4).double() / s


def _emul_rowwise(t):
    t = t.double()
    s = 448.0 / t.abs().amax(1, keepdim=True).clamp_min(1e-12)
    return (t * s).clamp(-448, 448).to(E4).double() / s


@pytest.mark.parametrize("R,C", [(37, 50), (130, 16), (5, 300)])
def test_cast_tensorwise(R, C):
    x = torch.randn(R, C, device=DEV, dtype=torch.bfloat16) * 3
    y, yt, sinv = F8.cast_tensorwise(x, E4, want_y=True, want_t=True)
    deq = y[:R].double() * sinv.double()
    ref = _emul_tensorwise(x)
    assert relerr(deq, ref) < 0.02  # interpreter rounding may differ by one fp8 ulp on a few elements
    assert relerr(deq, x) < 0.06
    RP = (R + 15) // 16 * 16
    assert yt.shape == (C, RP) and y.shape == (RP, C)
    assert (y[R:].float() == 0).all()
    y = y[:R]
    assert torch.equal(yt[:, :R].float(), y.t().float())
    assert (yt[:, R:].float() == 0).all()


@pytest.mark.parametrize("R,C,dtype,outs", [
    (37, 50, torch.bfloat16, (True, True)), (130, 200, torch.bfloat16, (True, True)),
    (130, 200, torch.bfloat16, (True, False)), (130, 200, torch.bfloat16, (False, True)),
    (130, 200, torch.float32, (True, True)),
])
def test_every_config_of_the_tuned_tensorwise_cast_gives_the_same_bytes(R, C, dtype, outs):
    """On a GPU the tensorwise cast pass autotunes over _TENSORWISE's tiles: each config must write every element
    (outputs poisoned) with the bytes of the quantisation, the same for all, with and without the delayed recipe's
    history (its atomic amax per tile)."""
    wy, wt = outs
    x = torch.randn(R, C, device=DEV, dtype=dtype) * 3
    x[R // 2, C // 3] = -20.0
    RP = (R + 15) // 16 * 16
    first = None
    for cfg in F8._TENSORWISE.configs:
        y, yt, sinv = F8.cast_tensorwise(x, E4, want_y=wy, want_t=wt, config=cfg)
        got = [t.view(torch.uint8).clone() for t in (y, yt) if t is not None]
        if first is None:
            first = got
            q = y[:R] if wy else yt[:, :R].t()
            assert relerr(q.double() * sinv.double(), _emul_tensorwise(x)) < 0.02
            assert sinv.item() == pytest.approx(20.0 / 448.0, rel=1e-6)
            if wy and wt:
                assert torch.equal(y.view(torch.uint8).t(), yt.view(torch.uint8))
            assert (y is None or y.shape == (RP, C)) and (yt is None or yt.shape == (C, RP))
        assert all(torch.equal(a, b) for a, b in zip(got, first)), cfg
        hist = F8.DelayedScaling(history_len=4).history()
        yd, ytd, sd = F8.cast_tensorwise(x, E4, want_y=wy, want_t=wt, history=hist, config=cfg)
        assert all(torch.equal(a, b) for a, b in zip([t.view(torch.uint8) for t in (yd, ytd) if t is not None],
                                                     first)), cfg  # first call: the scale of its own amax
        _, _, sd2 = F8.cast_tensorwise(x * 0.5, E4, want_y=wy, want_t=wt, history=hist, config=cfg)
        assert sd2.item() == pytest.approx(20.0 / 448.0, rel=1e-6), cfg  # the recorded amax (of the first call) per tile


@pytest.mark.parametrize("R,C", [(37, 50), (9, 130)])
@pytest.mark.parametrize("transpose", [False, True])
def test_cast_rowwise(R, C, transpose):
    x = torch.randn(R, C, device=DEV, dtype=torch.bfloat16) * torch.rand(R, 1, device=DEV).to(torch.bfloat16) * 5
    y, s = F8.cast_rowwise(x, E4, transpose=transpose, pad=True)
    src = x.t() if transpose else x
    Cn = src.shape[1]
    deq = y[:, :Cn].double() * s.double()
    assert relerr(deq, _emul_rowwise(src)) < 0.02
    assert (y[:, Cn:].float() == 0).all()


@pytest.mark.parametrize("R,C", [(37, 600), (9, 1000), (6, 4096)])
def test_every_config_of_the_tuned_rowwise_cast_is_correct(R, C):
    """On a GPU the rowwise cast autotunes over a space of tiles (one read per row when a chunk spans it, else the
    chunked two-pass loop); the interpreter cannot benchmark, so each config the pruner admits is checked here, with
    the zero pads and poisoned outputs."""
    import triton

    x = torch.randn(R, C, device=DEV, dtype=torch.bfloat16) * torch.rand(R, 1, device=DEV).to(torch.bfloat16) * 5
    CP = (C + 15) // 16 * 16
    space = F8._ROWWISE_ROWS.space((x, None, None, R, C, R, CP))
    assert len(space) >= 2 and all(c["BC"] <= max(64, triton.next_power_of_2(CP)) for c in space)
    ref = _emul_rowwise(x)
    for cfg in space:
        y, s = F8.cast_rowwise(x, E4, pad=True, config=cfg)
        assert relerr(y[:, :C].double() * s.double(), ref) < 0.02, cfg
        assert (y[:, C:].float() == 0).all(), cfg


@pytest.mark.parametrize("R,C,dtype", [(70, 40, torch.bfloat16), (150, 24, torch.float32),
                                       (300, 1000, torch.bfloat16)])
def test_transposed_rowwise_cast_every_config_matches_the_column_view_kernel_bit_for_bit(R, C, dtype):
    """transpose=True of a row-major x (the rowwise backward's x^T / dy^T, scales over the tokens) reads x along its
    rows (_colmax + _cast_cols_t): every config gives the bytes and scales of the one-kernel walk over the column
    view (the old path, still _cast_rowwise with the view's strides), pads included, outputs poisoned."""
    x = (torch.randn(R, C, device=DEV) * torch.rand(1, C, device=DEV) * 5).to(dtype)
    src = x.t()
    RP, CP = (C + 15) // 16 * 16, (R + 15) // 16 * 16
    y0 = torch.empty(RP, CP, device=DEV, dtype=E4)
    s0 = torch.empty(RP, 1, device=DEV, dtype=torch.float32)
    F8._ROWWISE_ROWS.run({"BR": 32, "BC": 64, "num_warps": 4}, lambda meta: (-(-RP // meta["BR"]),),
                         (src, y0, s0, C, R, RP, CP, src.stride(0), src.stride(1), y0.stride(0), y0.stride(1),
                          float(torch.finfo(E4).max)))
    assert relerr(y0[:C, :R].double() * s0[:C].double(), _emul_rowwise(src)) < 0.02
    for cfg in F8._COLS_T.configs:
        y, s = F8.cast_rowwise(x, E4, transpose=True, pad=True, pad_rows=True, config=cfg)
        assert y.shape == (RP, CP) and s.shape == (RP, 1)
        assert torch.equal(y.view(torch.uint8), y0.view(torch.uint8)), cfg
        assert torch.equal(s, s0), cfg


@pytest.mark.parametrize("R,C,dtype", [(70, 40, torch.bfloat16), (600, 300, torch.bfloat16),
                                       (150, 24, torch.float32)])
def test_column_amax_every_config(R, C, dtype):
    """The transposed rowwise cast's column amax pass: every config of its tuned space gives max |x| per column
    exactly (a max is exact in any dtype), sizes not multiples of any tile, the first / last row holding a column's
    max (the programs' row edges)."""
    x = (torch.randn(R, C, device=DEV) * torch.rand(1, C, device=DEV) * 5).to(dtype)
    x[0, 0], x[R - 1, C - 1] = -1e3, 2e3
    ref = x.float().abs().amax(0)
    for cfg in F8._COLMAX.configs:
        got = F8.column_amax(x, config=cfg)
        assert got.shape == (C,) and torch.equal(got, ref), cfg


def test_column_amax_space_fits_x():
    """The autotuner's space for a call: every config at Llama shapes (the prefetching ones included);
    for a small x, no program spans more rows than x has (rounded up to a power of two) nor a tile more columns."""
    def space(R, C):
        return F8._COLMAX.space((None, None, R, C))

    assert space(8192, 2048) == space(8192, 28672) == F8._COLMAX.configs
    assert {c["PREFETCH"] for c in space(4096, 4096)} == {0, 1}
    small = space(200, 100)  # rows round up to 256, columns to 128
    assert small and all(c["ROWS"] <= 256 and c["BK"] <= 128 for c in small)
    assert len(small) < len(F8._COLMAX.configs)


def _block_ref(t, br, bc):
    """float64 blockwise quantisation of t (R, C) in br x bc blocks: (dequantised (R, C), scale_inv per block)."""
    t = t.double()
    R, C = t.shape
    Rp, Cp = -(-R // br) * br, -(-C // bc) * bc
    tp = torch.zeros(Rp, Cp, dtype=torch.float64, device=t.device)
    tp[:R, :C] = t
    blocks = tp.view(Rp // br, br, Cp // bc, bc)
    s = 448.0 / blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12)
    q = (blocks * s[:, None, :, None]).clamp(-448, 448).to(E4).double() / s[:, None, :, None]
    return q.view(Rp, Cp)[:R, :C], 1 / s


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("want_y,want_t", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("tile", [False, True])
def test_cast_blockwise(tile, want_y, want_t, dtype):
    """1x128 groups (y along C, yT along R: one read of x for both) or 128x128 tiles (both layouts), fp32 input
    (two launches) too: values and scale_inv vs a float64 emulation, scales in blockwise_scale_layout (the layout
    torch.nn.functional.scaled_mm takes), zero pads (rows to 128; 128x128 scales' contraction-block dim to 4)."""
    R, C = 150, 260
    x = torch.randn(R, C, device=DEV, dtype=dtype) * torch.rand(R, 1, device=DEV, dtype=dtype) * 4
    y, sy, yt, syt = F8.cast_blockwise(x, E4, tile=tile, want_y=want_y, want_t=want_t, pad_rows=not tile)
    RP = R if tile else 256
    assert (y is None) != want_y and (yt is None) != want_t
    if want_y:
        shape, strides = F8.blockwise_scale_layout(RP, C, tile)
        assert y.shape == (RP, C) and tuple(sy.shape) == shape and sy.stride() == strides
        assert (y[R:].float() == 0).all()
        if tile:
            deq, sref = _block_ref(x, 128, 128)
            s = sy[:3].t()  # (R/128, C/128) of (L4, R/128)
            assert (sy[3:] == 0).all()  # L4 = 4 > 3 C-blocks: the zero pad
            se = s.repeat_interleave(128, 0)[:R].repeat_interleave(128, 1)[:, :C]
        else:
            deq, sref = _block_ref(x, 1, 128)
            s = sy[:R]
            se = s.repeat_interleave(128, 1)[:, :C]
        assert torch.allclose(s.double(), sref, rtol=1e-6, atol=0)
        assert relerr(y[:R].double() * se.double(), deq) < 0.02  # interpreter rounding: an fp8 ulp here and there
    if want_t:
        shape, strides = F8.blockwise_scale_layout(C, RP, tile)
        assert yt.shape == (C, RP) and tuple(syt.shape) == shape and syt.stride() == strides
        assert (yt[:, R:].float() == 0).all()
        if tile:
            deq, sref = _block_ref(x, 128, 128)
            s = syt[:2]  # (R/128, C/128) of (L4, C/128)
            assert (syt[2:] == 0).all()
            se = s.repeat_interleave(128, 0)[:R].repeat_interleave(128, 1)[:, :C]
        else:
            deq, sref = _block_ref(x, 128, 1)
            s = syt.t()[:2]  # (RP/128, C)
            se = s.repeat_interleave(128, 0)[:R]
        assert torch.allclose(s.double(), sref, rtol=1e-6, atol=0)
        assert relerr(yt[:, :R].t().double() * se.double(), deq) < 0.02
    if want_y and want_t and tile:  # one scale per tile: yT is exactly y's transpose
        assert torch.equal(y.view(torch.uint8).t(), yt.view(torch.uint8))


@pytest.mark.parametrize("want_y,want_t,tile", [(True, False, False), (False, True, False), (True, True, False),
                                                (True, True, True)])
def test_every_config_of_the_tuned_blockwise_cast_gives_the_same_bytes(want_y, want_t, tile):
    """On a GPU the blockwise cast autotunes over _CAST_BLOCK's space (tile heights / widths and warps that span the
    128-wide groups of the outputs written); the interpreter runs the space's first config. Every config the space
    admits for these outputs writes the same fp8 bytes, scales and zero pads as that one (outputs poisoned), at a
    shape that is no multiple of any tile."""
    R, C = 150, 260
    x = torch.randn(R, C, device=DEV, dtype=torch.bfloat16) * torch.rand(R, 1, device=DEV).to(torch.bfloat16) * 4
    space = F8._CAST_BLOCK.space(TILE=tile, WRITE_Y=want_y, WRITE_T=want_t)
    assert len(space) >= 2
    assert all((c["BC"] == 128 or not (want_y or tile)) and (c["BR"] == 128 or not (want_t or tile)) for c in space)
    first = F8.cast_blockwise(x, E4, tile=tile, want_y=want_y, want_t=want_t, pad_rows=not tile, config=space[0])
    for cfg in space[1:]:
        out = F8.cast_blockwise(x, E4, tile=tile, want_y=want_y, want_t=want_t, pad_rows=not tile, config=cfg)
        for a, b in zip(first, out):
            if a is None:
                assert b is None
            elif a.dtype == E4:
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), cfg
            else:
                assert torch.equal(a, b), cfg


@pytest.mark.skipif(DEV == "cpu", reason="the fast path is CUDA's (saturating conversion, rcp.approx)")
@pytest.mark.parametrize("tile,want_y,want_t", [(False, True, True), (False, True, False), (True, True, True)])
def test_blockwise_cast_fast_path_matches_the_exact_one(monkeypatch, tile, want_y, want_t):
    """Where the fp8 conversion saturates (CUDA: cvt.rn.satfinite) the blockwise cast skips its clamp to +-max and
    takes its 1x128 groups' scales from a fast reciprocal (_conversion_saturates, _group_scales; x^T alone keeps
    the exact path, 128x128 tiles the exact division: their bytes are the clamped path's).
    Same config, both paths: scale_inv within 2 ulp, fp8 codes equal or (a product on a rounding boundary) one code
    apart in rare elements, zero groups and each group's largest element (scaled onto max, or just above it)
    included."""
    R, C = 150, 260
    torch.manual_seed(3)
    x = torch.randn(R, C, device=DEV, dtype=torch.bfloat16) * torch.rand(R, 1, device=DEV).to(torch.bfloat16) * 300
    x[:, 128:256] = 0  # all-zero groups: the 1e-12 floor
    outs = {}
    for sat in (False, True):
        monkeypatch.setattr(F8, "_conversion_saturates", lambda dev, sat=sat: sat)
        cfg = F8._CAST_BLOCK.space(TILE=tile, WRITE_Y=want_y, WRITE_T=want_t)[0]
        outs[sat] = F8.cast_blockwise(x, E4, tile=tile, want_y=want_y, want_t=want_t, pad_rows=not tile,
                                      config=cfg)
    for a, b in zip(outs[False], outs[True]):
        if a is None:
            assert b is None
        elif a.dtype == E4:
            ca, cb = a.view(torch.uint8).int(), b.view(torch.uint8).int()
            assert torch.equal(ca & 0x80, cb & 0x80)  # signs
            assert (ca - cb).abs().max() <= 1 and (ca != cb).float().mean() < 1e-3
            assert int((cb & 0x7F).max()) == 0x7E  # max (448) was written: the edge was there, and saturated
            if tile:
                assert torch.equal(ca, cb)
        else:
            assert torch.allclose(a, b, rtol=2.5e-7, atol=0)
            if tile:
                assert torch.equal(a, b)


@pytest.mark.skipif(DEV == "cpu", reason="the Gluon kernel is NVIDIA's (no interpreter)")
@pytest.mark.parametrize("R,C,dtype,out,row_stride", [
    (1100, 1040, torch.bfloat16, E4, None), (8192, 1024, torch.bfloat16, E4, None),
    (1024, 4096, torch.float16, E4, None), (1100, 1040, torch.bfloat16, torch.float8_e5m2, None),
    (1000, 1104, torch.bfloat16, E4, 1536), (257, 1024, torch.bfloat16, E4, None),
])
def test_gluon_both_ways_cast_gives_the_triton_kernels_bytes(R, C, dtype, out, row_stride):
    """dy and dy^T in 1x128 groups (the blockwise backward's cast) come from fp8_cast_gluon's kernel on NVIDIA
    GPUs: its bytes and scale_inv must be the Triton kernel's (same arithmetic), every element written (outputs
    poisoned), awkward sizes (neither dim a multiple of 128; the kernel takes rows 16-element aligned), fp16 /
    e5m2, a row stride wider than the row, rows of very different magnitude and all-zero groups (the 1e-12
    floor). Unaligned rows keep the Triton kernel."""
    from primus.turbo import fp8_cast_gluon

    torch.manual_seed(5)
    base = torch.randn(R, row_stride or C, device=DEV, dtype=dtype)
    x = base[:, :C]
    x.mul_(torch.rand(R, 1, device=DEV).to(dtype) * 40)
    x[:, 256:384] = 0
    x[:128] = 0
    assert fp8_cast_gluon.unavailable(x, F8._conversion_saturates(x.device)) is None
    assert "aligned" in fp8_cast_gluon.unavailable(base[:, : C - 8], True)
    cfg = F8._CAST_BLOCK.space(TILE=False, WRITE_Y=True, WRITE_T=True)[0]
    ref = F8.cast_blockwise(x, out, want_t=True, pad_rows=True, config=cfg)  # the Triton kernel
    got = F8.cast_blockwise(x, out, want_t=True, pad_rows=True)
    for a, b in zip(ref, got):
        assert a.shape == b.shape and a.stride() == b.stride()
        assert not torch.isnan(b.float()).any()
        if a.dtype.itemsize == 1:
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        else:
            assert torch.equal(a, b)
    y, sy, yt, syt = got
    RP = y.shape[0]
    assert (y[R:].float() == 0).all() and (yt[:, R:].float() == 0).all()
    deq = yt.double().view(C, RP // 128, 128) * syt[:, :, None].double()
    assert relerr(deq.reshape(C, RP)[:, :R], x.t()) < (0.06 if out == E4 else 0.12)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
@pytest.mark.parametrize("fmt", ["e4m3", "hybrid"])
@pytest.mark.parametrize("M,K,N", [(50, 64, 48), (33, 144, 32)])
def test_fp8_linear(recipe, fmt, M, K, N):
    x = torch.randn(2, M, K, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(N, K, device=DEV) / K ** 0.5).to(torch.bfloat16).requires_grad_()
    b = torch.randn(N, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(2, M, N, device=DEV, dtype=torch.bfloat16)
    y = F8.fp8_linear(x, w, b, recipe=recipe, fmt=fmt)
    y.backward(dy)
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    yr = xd @ wd.t() + bd
    yr.backward(dy.double())
    gband = 0.15 if fmt == "hybrid" else 0.08
    assert relerr(y, yr) < 0.08
    assert relerr(x.grad, xd.grad) < gband
    assert relerr(w.grad, wd.grad) < gband
    assert relerr(b.grad, bd.grad) < 1e-2
    if recipe != "blockwise":
        emul = _emul_tensorwise if recipe == "tensorwise" else _emul_rowwise
        ye = emul(x.detach().reshape(-1, K)) @ emul(w.detach()).t() + b.detach().double()
        assert relerr(y.reshape(-1, N), ye) < 0.02


# ------------------------------------------------------------------ blockwise GEMMs: torch's scaled_mm or Triton


def _cdiv(a, b):
    return -(-a // b)


def _torch_blockwise_check(a, sa, recipe_a, b, sb, recipe_b):
    """PyTorch's checks before its blockwise GEMM, in Python (torch.nn.functional.scaled_mm on CUDA cannot run on
    this CPU, and CPU / meta scaled_mm do not check these layouts). Source: pytorch/pytorch
    aten/src/ATen/native/cuda/ScaledBlas.cpp: _scaled_mm_cuda_v2_out (mat_a.size(1) % 16, mat_b sizes % 16; the
    recipe pairs of scale_kernel_dispatch), _scaled_gemm (sm90: row-major mat_a, column-major mat_b),
    _scaled_block1x128_block1x128 / _scaled_block1x128_block128x128 / _scaled_block128x128_block1x128 (scale
    shapes and strides, the TORCH_CHECK_VALUEs quoted below); aten/src/ATen/native/ScaledBlasUtils.cpp
    check_deepseek_recipe (fp32 scales; e4m3fn operands: checked by the plan, not here)."""
    M, K = a.shape
    K2, N = b.shape
    assert K == K2 and K % 16 == 0 and K2 % 16 == 0 and N % 16 == 0
    assert a.stride(1) == 1 and b.stride(0) == 1, "sm90 cuBLASLt: row-major x column-major"
    assert (recipe_a, recipe_b) in {("1x128", "128x128"), ("128x128", "1x128"), ("1x128", "1x128")}
    L = _cdiv(K, 128)
    L4 = _cdiv(L, 4) * 4
    for s, outer, recipe in ((sa, M, recipe_a), (sb, N, recipe_b)):
        assert s.dtype == torch.float32
        if recipe == "1x128":  # "scale_a must have shape M x ceil_div(K, 128)", "strides (1, M)"
            assert tuple(s.shape) == (outer, L), (s.shape, outer, L)
            assert s.stride(0) == 1 and (s.stride(1) == outer or (s.size(1) == 1 and s.stride(1) == 1)), s.stride()
        else:  # "shape round_up(ceil_div(K, 128), 4) x ceil_div(N, 128)", "strides (1, round_up(...))"
            assert tuple(s.shape) == (L4, _cdiv(outer, 128)), (s.shape, outer, L4)
            assert s.stride(0) == 1 and (s.stride(1) == L4 or (s.size(1) == 1 and s.stride(1) == 1)), s.stride()


@pytest.mark.parametrize("outer,k", [(256, 512), (384, 1280), (50, 144), (128, 128), (4096, 14336), (14336, 4096)])
def test_blockwise_scale_layout_is_the_one_torch_scaled_mm_takes(outer, k):
    """blockwise_scale_layout against PyTorch's own construction in test/test_scaled_matmul_cuda.py
    (test_scaled_mm_block_wise_numerics): 1x128 scales `x_scales.t().contiguous().t()` of the natural (outer, K/128);
    128x128 scales `_pad_128x128_scales(scales).t()` (K/128 padded to a multiple of 4 with zeros) of the natural
    (outer/128, K/128); and against the C++ checks (_torch_blockwise_check)."""
    def same(layout, t):  # a size-1 dim's stride does not matter (PyTorch accepts 1 or the formula there too)
        (shape, strides) = layout
        return shape == tuple(t.shape) and all(n == 1 or a == b for n, a, b in zip(shape, strides, t.stride()))

    nat = torch.rand(outer, _cdiv(k, 128))
    assert same(F8.blockwise_scale_layout(outer, k, tile=False), nat.t().contiguous().t())
    nat = torch.rand(_cdiv(outer, 128), _cdiv(k, 128))
    pad = (4 - nat.shape[-1] % 4) % 4
    assert same(F8.blockwise_scale_layout(outer, k, tile=True), torch.nn.functional.pad(nat, (0, pad)).t())
    if k % 16 == 0 and outer % 16 == 0:
        a = torch.zeros(outer, k, dtype=E4)
        b = torch.zeros(outer, k, dtype=E4).t()
        for ta, tb in ((False, True), (True, False), (False, False)):
            sa = F8._scale_tensor(outer, k, ta, "cpu")
            sb = F8._scale_tensor(outer, k, tb, "cpu")
            _torch_blockwise_check(a, sa, "128x128" if ta else "1x128", b, sb, "128x128" if tb else "1x128")


@pytest.mark.parametrize("fmt", ["e4m3", "hybrid"])
@pytest.mark.parametrize("M,K,N", [(50, 256, 384), (200, 144, 128)])
def test_blockwise_linear_hands_every_gemm_torchs_layout(monkeypatch, fmt, M, K, N):
    """The three GEMMs of a blockwise fp8 linear (fprop 1x128 x 128x128, dgrad 1x128 x 128x128, wgrad 1x128 x 1x128)
    get operands and scales in the layout PyTorch's cuBLASLt blockwise path accepts, whichever GEMM the plan picks
    (on this CPU: the Triton one; the tensors are the same on an sm90 GPU, where scaled_mm gets them)."""
    calls = []
    real = F8.blockwise_mm

    def spy(a, sa, b, sb, b_tile, out_dtype, gemm):
        calls.append((a, sa, b, sb, b_tile, gemm))
        return real(a, sa, b, sb, b_tile, out_dtype, gemm)

    monkeypatch.setattr(F8, "blockwise_mm", spy)
    x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(N, K, device=DEV) / K ** 0.5).to(torch.bfloat16).requires_grad_()
    y = F8.fp8_linear(x, w, None, "blockwise", fmt)
    y.backward(torch.randn(M, N, device=DEV, dtype=torch.bfloat16))
    assert [c[4] for c in calls] == [True, True, False]  # fprop, dgrad: 128x128 weight; wgrad: 1x128 x 1x128
    plan = F8.blockwise_gemms(DEV, fmt, K, N)
    assert [c[5] for c in calls] == [plan["fprop"], plan["dgrad"], plan["wgrad"]]
    for a, sa, b, sb, b_tile, _ in calls:
        _torch_blockwise_check(a, sa, "1x128", b, sb, "128x128" if b_tile else "1x128")
    assert calls[0][0].shape[0] % 128 == 0 and calls[2][0].shape[1] % 128 == 0  # tokens padded to 128


def test_blockwise_gemm_provider_rule(monkeypatch):
    """One rule picks the blockwise GEMM: torch.nn.functional.scaled_mm where PyTorch runs its 1x128 / 128x128
    recipes (CUDA, not ROCm, major capability 9, CUDA >= 12.9, a torch with F.scaled_mm), else Triton, with the
    reason; an override forces either, and forcing scaled_mm where it cannot run is an error."""
    assert F8.blockwise_gemm_provider("cpu") == "triton"
    monkeypatch.setattr(F8._common, "interpreting", lambda: False)
    assert "CUDA-only" in F8._scaled_mm_blockwise_missing("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    cap = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap[0])
    assert F8.blockwise_gemm_provider("cuda:0") == "scaled_mm"
    for c, word in (((10, 0), "sm100"), ((8, 9), "sm89"), ((12, 0), "sm120")):
        cap[0] = c
        assert F8.blockwise_gemm_provider("cuda:0") == "triton"
        assert word in F8._scaled_mm_blockwise_missing("cuda:0")
    cap[0] = (9, 0)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert "12.9" in F8._scaled_mm_blockwise_missing("cuda:0")
    monkeypatch.setattr(torch.version, "cuda", "12.9")
    assert F8.blockwise_gemm_provider("cuda:0") == "scaled_mm"
    monkeypatch.setattr(torch.version, "hip", "6.4")
    assert "ROCm" in F8._scaled_mm_blockwise_missing("cuda:0")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(F8, "BLOCKWISE_GEMM_OVERRIDE", "triton")
    assert F8.blockwise_gemm_provider("cuda:0") == "triton"
    monkeypatch.setattr(F8, "BLOCKWISE_GEMM_OVERRIDE", "cublas")
    with pytest.raises(ValueError, match="override"):
        F8.blockwise_gemm_provider("cuda:0")
    monkeypatch.setattr(F8, "BLOCKWISE_GEMM_OVERRIDE", "scaled_mm")
    with pytest.raises(RuntimeError, match="cannot run here"):
        F8.blockwise_gemm_provider("cpu")
    monkeypatch.setattr(F8, "BLOCKWISE_GEMM_OVERRIDE", None)
    monkeypatch.delattr(torch.nn.functional, "scaled_mm")
    assert "scaled_mm" in F8._scaled_mm_blockwise_missing("cuda:0")


def test_blockwise_gemms_per_matmul(monkeypatch):
    """Where scaled_mm serves the device: every matmul with e4m3 operands and a contraction dim that is a multiple
    of 128 (wgrad's, the tokens, is padded to 128); e5m2 gradients (hybrid) keep dgrad and wgrad on Triton
    (PyTorch's check_deepseek_recipe takes float8_e4m3fn operands only)."""
    monkeypatch.setattr(F8, "_PLANS", {})  # plans are decided once per shape: start from none
    monkeypatch.setattr(F8, "blockwise_gemm_provider", lambda device=None: "scaled_mm")
    allm = {"fprop": "scaled_mm", "dgrad": "scaled_mm", "wgrad": "scaled_mm"}
    assert F8.blockwise_gemms("cpu", "e4m3", 4096, 14336) == allm
    assert F8.blockwise_gemms("cpu", "hybrid", 4096, 14336) == {"fprop": "scaled_mm", "dgrad": "triton",
                                                                 "wgrad": "triton"}
    assert F8.blockwise_gemms("cpu", "e4m3", 144, 384) == {**allm, "fprop": "triton"}
    assert F8.blockwise_gemms("cpu", "e4m3", 256, 48) == {**allm, "dgrad": "triton"}
    monkeypatch.setattr(F8, "blockwise_gemm_provider", lambda device=None: "triton")
    F8._PLANS.clear()
    assert set(F8.blockwise_gemms("cpu", "e4m3", 4096, 14336).values()) == {"triton"}


def test_saved_tile_scales_back_in_the_padded_layout():
    """The backward gets the weight's 128x128 scales as the unpadded (N/128, K/128) view it saved (the shape the
    TorchTitan custom op declares) and restores the padded layout: a view of the cast's own storage when its strides
    survived, a small copy when they did not (a compiler or an offload handing it back contiguous)."""
    w = torch.randn(300, 260, device=DEV, dtype=torch.bfloat16)
    _, _, _, swt = F8.cast_blockwise(w, E4, tile=True, want_y=False, want_t=True)
    assert tuple(swt.shape) == (4, 3) and (swt[3] == 0).all()  # (L4 over N/128 = 3, K/128)
    saved = swt[:3]
    v = F8._tile_scales_padded(saved, 260, 300)
    assert v.data_ptr() == swt.data_ptr() and v.shape == swt.shape and v.stride() == swt.stride()
    c = F8._tile_scales_padded(saved.contiguous(), 260, 300)
    assert (tuple(c.shape), c.stride()) == F8.blockwise_scale_layout(260, 300, True)
    assert torch.equal(c, swt)


def _deq_a(a, sa):
    return a.double() * sa.double().repeat_interleave(128, 1)[:, :a.shape[1]]


def _deq_b(b, sb, b_tile):
    K, N = b.shape
    if b_tile:  # sb (L4, N/128)
        s = sb.double()[:_cdiv(K, 128)].repeat_interleave(128, 0)[:K].repeat_interleave(128, 1)[:, :N]
    else:  # sb (N, K/128)
        s = sb.double().t().repeat_interleave(128, 0)[:K]
    return b.double() * s


SCALED_MM_WHY = F8._scaled_mm_blockwise_missing(DEV)


@pytest.mark.parametrize("gemm", ["triton", "scaled_mm"])
def test_blockwise_gemms_match_an_exact_emulation(gemm):
    """Each of the linear's three GEMM forms on the casts' own outputs vs the float64 product of the dequantised
    operands: equal to output rounding (bf16 / fp32), so the scale convention (scale_inv multiplies the product),
    layouts and transposes are exact; the scaled_mm variant on CUDA sm90 only."""
    if gemm == "scaled_mm" and SCALED_MM_WHY:
        pytest.skip(f"torch.nn.functional.scaled_mm blockwise unavailable: {SCALED_MM_WHY}")
    M, K, N = (300, 512, 384) if DEV == "cuda" else (50, 256, 128)
    x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16) * torch.rand(M, 1, device=DEV).to(torch.bfloat16) * 3
    w = torch.randn(N, K, device=DEV, dtype=torch.bfloat16) / K ** 0.5
    dy = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
    xq, sx, _, _ = F8.cast_blockwise(x, E4, pad_rows=True)
    wq, sw, wqt, swt = F8.cast_blockwise(w, E4, tile=True, want_t=True)
    dyq, sdy, dyqt, sdyt = F8.cast_blockwise(dy, E4, want_t=True, pad_rows=True)
    _, _, xqt, sxt = F8.cast_blockwise(x, E4, want_y=False, want_t=True, pad_rows=True)
    forms = {"fprop": (xq, sx, wq.t(), sw, True, torch.bfloat16),
             "dgrad": (dyq, sdy, wqt.t(), swt, True, torch.bfloat16),
             "wgrad": (dyqt, sdyt, xqt.t(), sxt, False, torch.float32)}
    for name, (a, sa, b, sb, tile, odt) in forms.items():
        out = F8.blockwise_mm(a, sa, b, sb, tile, odt, gemm)
        ref = _deq_a(a, sa) @ _deq_b(b, sb, tile)
        assert out.dtype == odt
        # fp32 out: exact in the interpreter; on Hopper the fp8 tensor cores accumulate each 128-deep K block with
        # a narrower adder than fp32 (measured 1.4e-4 on the H200, Triton and cuBLAS alike)
        assert relerr(out, ref) < (5e-3 if odt == torch.bfloat16 else 1e-5 if DEV == "cpu" else 1e-3), name


@pytest.mark.parametrize("M,K,N", [(70, 144, 200), (300, 256, 96)])  # K % 128 != 0 (masked K loop); ragged M, N
@pytest.mark.parametrize("form", ["fprop", "wgrad"])
def test_every_config_of_the_tuned_blockwise_gemm_matches_an_exact_emulation(M, K, N, form):
    """Each tile of the Triton blockwise GEMM's tuned space (grouped 1-D grid, rows / columns past M / N wrapped, K
    loads unmasked only when K % 128 == 0) vs the float64 product of the dequantised operands: a wrong band, wrap or
    pointer step gives errors of order 1."""
    x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=DEV, dtype=torch.bfloat16) / K ** 0.5
    if form == "fprop":  # x 1x128 @ W^T 128x128
        a, sa, _, _ = F8.cast_blockwise(x, E4)
        wq, sw, _, _ = F8.cast_blockwise(w, E4, tile=True)
        b, sb, tile, odt = wq.t(), sw, True, torch.bfloat16
    else:  # 1x128 @ 1x128 (the wgrad form: both groups along the contraction dim), fp32 out
        a, sa, _, _ = F8.cast_blockwise(x, E4)
        wq, sw, _, _ = F8.cast_blockwise(w, E4)
        b, sb, tile, odt = wq.t(), sw, False, torch.float32
    ref = _deq_a(a, sa) @ _deq_b(b, sb, tile)
    space = F8._GEMM_BLOCKWISE.space((a, b, None, sa, sb, M, N, K), UPCAST=False)
    assert len(space) >= 2
    for cfg in space:
        out = F8.gemm_blockwise(a, sa, b, sb, tile, odt, config=cfg)
        assert out.dtype == odt and out.shape == (M, N)
        assert relerr(out, ref) < (5e-3 if odt == torch.bfloat16 else 1e-3), cfg


@pytest.mark.skipif(SCALED_MM_WHY is not None,
                    reason=f"torch.nn.functional.scaled_mm blockwise (CUDA sm90, CUDA >= 12.9): {SCALED_MM_WHY}")
@pytest.mark.parametrize("fmt", ["e4m3", "hybrid"])
@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M,K,N", [(300, 512, 384), (2048, 1280, 768), (1024, 4096, 1024)])
def test_blockwise_linear_through_scaled_mm_on_sm90(monkeypatch, M, K, N, wdtype, fmt):
    """On an sm90 GPU the blockwise linear's e4m3 GEMMs run in torch.nn.functional.scaled_mm (all three for e4m3;
    fprop only for hybrid, whose e5m2 gradients keep Triton): fwd + both grads within the fp8 band of float64, bias
    included, fp32 weights (TorchTitan) too, outputs NaN-poisoned; and equal, to output rounding, to the same linear
    with every GEMM forced to Triton (same casts, other GEMM)."""
    torch.manual_seed(0)
    plan = F8.blockwise_gemms(DEV, fmt, K, N)
    assert plan == ({"fprop": "scaled_mm", "dgrad": "scaled_mm", "wgrad": "scaled_mm"} if fmt == "e4m3" else
                    {"fprop": "scaled_mm", "dgrad": "triton", "wgrad": "triton"})
    x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(N, K, device=DEV) / K ** 0.5).to(wdtype).requires_grad_()
    b = torch.randn(N, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
    outs = []
    for force in (None, "triton"):
        monkeypatch.setattr(F8, "BLOCKWISE_GEMM_OVERRIDE", force)
        for t in (x, w, b):
            t.grad = None
        y = F8.fp8_linear(x, w, b, "blockwise", fmt)
        y.backward(dy)
        outs.append((y.detach(), x.grad, w.grad, b.grad))
    (y, gx, gw, gb), (yt, gxt, gwt, _) = outs
    assert gw.dtype == wdtype
    xd, wd = x.detach().double(), w.detach().double()
    gband = 0.15 if fmt == "hybrid" else 0.08
    assert relerr(y, xd @ wd.t() + b.detach().double()) < 0.08
    assert relerr(gx, dy.double() @ wd) < gband
    assert relerr(gw, dy.double().t() @ xd) < gband
    assert relerr(gb, dy.double().sum(0)) < 1e-2
    assert relerr(y, yt) < 1e-2 and relerr(gx, gxt) < 1e-2 and relerr(gw, gwt) < 1e-2


@pytest.mark.parametrize("M,K,N", [(1024, 256, 512), (50, 64, 48)])
def test_fp8_linear_fp32_weights_as_torchtitan_runs_it(M, K, N):
    """TorchTitan on one GPU keeps fp32 parameters and runs bf16 autocast: the fp8 linear gets a bf16 input and an
    fp32 weight, and returns an fp32 weight gradient. Through the TorchTitan custom ops (the path that gave an
    intermittent NaN gradient norm on the H200 on 2026-11-29), outputs poisoned, repeated so the caching allocator
    hands back used blocks; finite and within the hybrid band every time."""
    from primus.turbo import fp8_ops

    torch.manual_seed(0)
    w = (torch.randn(N, K, device=DEV) / K ** 0.5).requires_grad_()
    for _ in range(3):
        x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
        w.grad = None
        y = fp8_ops.fp8_linear_fwd(x, w, "tensorwise", "hybrid")[0]
        y.backward(dy)
        assert w.grad.dtype == torch.float32
        for t in (y, x.grad, w.grad):
            assert torch.isfinite(t).all()
        xd, wd = x.detach().double(), w.detach().double()
        assert relerr(y, xd @ wd.t()) < 0.08
        assert relerr(x.grad, dy.double() @ wd) < 0.15
        assert relerr(w.grad, dy.double().t() @ xd) < 0.15


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("R,C", [(48, 64), (512, 256), (1000, 2048)])
def test_cast_tensorwise_writes_every_element_of_both_outputs(R, C, dtype):
    """Poisoned outputs, both requested: on the H200 fp32 input used to leave transposed elements unwritten
    (a Triton/ptxas defect, see cast_tensorwise); y and yT must be each other's transpose exactly."""
    x = torch.randn(R, C, device=DEV, dtype=dtype)
    y, yt, _ = F8.cast_tensorwise(x, E4, want_y=True, want_t=True, pad_t=False)
    assert not torch.isnan(y.float()).any() and not torch.isnan(yt.float()).any()
    assert torch.equal(y.view(torch.uint8).t(), yt.view(torch.uint8))


@pytest.mark.skipif(DEV != "cuda", reason="torch.compile of the fp8 custom ops: GPU only")
def test_compiled_fp32_weight_fp8_mlp_as_torchtitan_trains_it():
    """The TorchTitan path end to end on a small scale: fp32 parameters, bf16 autocast, the turbo fp8 linears
    swapped in, each block compiled; several optimizer steps; every gradient finite at every step (once, a
    NaN gradient norm at step 1 in 3 of 4 TorchTitan runs) and the compiled grads equal the eager ones closely."""
    from primus.backends.torchtitan import turbo as TT

    torch.manual_seed(0)
    D, F = 512, 1536

    def build():
        torch.manual_seed(1)
        m = torch.nn.Sequential(torch.nn.Linear(D, F, bias=False), torch.nn.SiLU(),
                                torch.nn.Linear(F, D, bias=False)).to(DEV)
        assert len(TT.swap_float8_linears(m, "tensorwise", filter_fqns=(), fmt="hybrid")) == 2
        return m

    eager, comp = build(), build()
    comp = torch.compile(comp)
    for step in range(4):
        x = torch.randn(8, 1024, D, device=DEV)
        grads = []
        for m in (eager, comp):
            m.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = m(x).float().pow(2).mean()
            loss.backward()
            g = [p.grad for p in m.parameters()]
            assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in g), f"step {step}"
            grads.append(g)
        for ge, gc in zip(*grads):
            assert relerr(gc, ge) < 0.02, f"step {step}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tile", [False, True])
@pytest.mark.parametrize("R,C", [(200, 384), (1000, 2048), (4096, 1024)])
def test_cast_blockwise_writes_every_element_of_both_outputs(R, C, tile, dtype):
    """Poisoned outputs, both layouts from one read (the weight's 128x128 cast, dy's two 1x128 casts): nothing left
    unwritten (the H200 defect of cast_tensorwise's fp32 transposed store), the tile cast's yT exactly y's
    transpose. Large shapes on the GPU only."""
    if DEV == "cpu" and R > 200:
        pytest.skip("interpreter: the small shape only")
    x = torch.randn(R, C, device=DEV, dtype=dtype)
    y, sy, yt, syt = F8.cast_blockwise(x, E4, tile=tile, want_t=True, pad_rows=not tile)
    for t in (y, yt, sy, syt):
        assert not torch.isnan(t.float()).any()
    if tile:
        assert torch.equal(y.view(torch.uint8).t(), yt.view(torch.uint8))


def _scale_of(amax, margin=0):
    return 448.0 / amax / 2 ** margin


def test_delayed_cast_scale_follows_the_history():
    """Delayed scaling, TE semantics: call n's scale = 448 / max(amax of the last `history_len` calls before n)
    / 2^margin; the first call uses its own amax. Inputs with known amax (one planted element) show which amaxes
    each call used; the fp8 values must be x * that scale (clamped), and scale_inv its inverse."""
    st = F8.DelayedScaling(history_len=2, margin=1, algo="max").history()
    amaxes = [2.0, 8.0, 1.0, 0.5, 0.25]
    want_amax = [2.0, 2.0, 8.0, 8.0, 1.0]  # first: own; then max of the previous two calls' amaxes
    for a, w in zip(amaxes, want_amax):
        x = torch.rand(130, 200, device=DEV, dtype=torch.bfloat16) * (a / 2)  # 3 x 4 programs
        x[129, 150] = -a
        y, yt, sinv = F8.cast_tensorwise(x, E4, want_y=True, want_t=True, history=st)
        scale = _scale_of(w, margin=1)
        assert sinv.item() == pytest.approx(1 / scale, rel=1e-6), (a, w)
        ref = (x.double() * scale).clamp(-448, 448).to(E4).double()
        assert relerr(y[:130].double(), ref) < 0.02
        assert torch.equal(yt[:, :130].float(), y[:130].t().float())
    assert sorted(st.amax_history.tolist()) == [0.25, 0.5]  # the last two (each enters at the end of its cast)
    assert int(st.meta[1]) == 0  # the arrival count is back to 0 between launches


def test_delayed_cast_launches_the_amax_pass_until_call_0_ran_and_a_lost_flag_costs_no_bytes(monkeypatch):
    """The amax pass (the first call's own amax) is launched only until the host knows the operand's first recorded cast
    ran; then one kernel per call. A view rebuilt around a copy of META (no flag: e.g. a functionalised custom-op
    input) launches the pass again, which the GPU skips after the first call: the same bytes and state as the primed
    path. Replays (record=False) never launch it."""
    launched = []
    real = F8._amax_partials
    monkeypatch.setattr(F8, "_amax_partials", lambda flat, delayed=None: launched.append(delayed is not None)
                        or real(flat, delayed))
    settings = F8.DelayedScaling(history_len=4, margin=0, algo="max")
    a, b = settings.history(), settings.history()
    xs = [torch.randn(40, 48, device=DEV, dtype=torch.bfloat16) * (1 + i) for i in range(4)]
    for i, x in enumerate(xs):
        launched.clear()
        ya, ta, sa = F8.cast_tensorwise(x, E4, want_y=True, want_t=True, history=a)
        assert launched == ([True] if i == 0 else []), i
        if i == 0:
            F8.cast_tensorwise(x, E4, want_y=True, want_t=True, history=b)
        else:  # b's META flag lost: a fresh view around copies of its state
            b = F8.AmaxHistory(settings, b.buf, b.meta.clone())
            assert not b.primed
            launched.clear()
            yb, tb, sb = F8.cast_tensorwise(x, E4, want_y=True, want_t=True, history=b)
            assert launched == [True]
            assert torch.equal(ya.view(torch.uint8), yb.view(torch.uint8)) and torch.equal(sa, sb), i
            assert torch.equal(ta.view(torch.uint8), tb.view(torch.uint8)), i
        assert torch.equal(a.buf, b.buf) and torch.equal(a.meta, b.meta), i
        assert a.primed
    launched.clear()
    _, _, s_replay = F8.cast_tensorwise(xs[0], E4, want_y=True, history=a, record=False)
    assert launched == [] and torch.equal(s_replay, sa) and a.calls == 4  # the last call's scale, state unchanged


def test_delayed_cast_of_fp32_input_moves_the_state_once_per_call():
    """fp32 input with both outputs runs two launches (a Triton defect, see cast_tensorwise); only the last one
    records the amax and moves the state on, so the state, scales and bytes equal one launch per output's."""
    settings = F8.DelayedScaling(history_len=4, margin=0, algo="max")
    both, one = settings.history(), settings.history()
    for i in range(3):
        x = torch.randn(40, 48, device=DEV, dtype=torch.float32) * (1 + i)
        y, yt, s = F8.cast_tensorwise(x, E4, want_y=True, want_t=True, history=both, pad_t=False)
        y1, _, s1 = F8.cast_tensorwise(x, E4, want_y=True, want_t=False, history=one, pad_t=False)
        assert torch.equal(s, s1) and torch.equal(y.view(torch.uint8), y1.view(torch.uint8)), i
        assert torch.equal(yt.view(torch.uint8), y.t().contiguous().view(torch.uint8)), i
    assert both.calls == one.calls == 3 and torch.equal(both.buf, one.buf)


def test_autotuning_a_stateful_launch_tunes_on_copies_and_runs_the_pick_once(monkeypatch):
    """On a GPU, the first launch of a new key autotunes: the kernel runs again for every config. A recorded delayed
    cast moves its state on at each run, so with stateful= the tuner gets copies of those args and the pick runs
    once on the real ones; other args are passed as they are. (Triton's autotuner is replaced by a recorder here:
    the interpreter never tunes.)"""
    from types import SimpleNamespace

    from primus.turbo import _common

    tuned = _common.Tuned(F8._cast_tensorwise, [{"BR": 64, "BC": 64, "num_warps": 4},
                                                {"BR": 32, "BC": 128, "num_warps": 4}], key=["R", "C"])
    tuner_saw, ran = [], []

    class Recorder:
        cache: dict = {}
        best_config = SimpleNamespace(kwargs={"BR": 32, "BC": 128}, num_warps=4)

        def __getitem__(self, grid):
            return lambda *args, **consts: tuner_saw.append(args)

    monkeypatch.setattr(tuned, "_auto", Recorder())
    monkeypatch.setattr(tuned, "run", lambda cfg, grid, args, **consts: ran.append((cfg, args)))
    monkeypatch.setattr(_common, "interpreting", lambda: False)
    x, state, out = torch.ones(4), torch.arange(3.0), torch.zeros(4)
    tuned.launch(lambda meta: (1,), (x, state, out), stateful=(1,), DELAYED=True)
    (tune_args,) = tuner_saw
    assert tune_args[0] is x and tune_args[2] is out and tune_args[1] is not state
    assert torch.equal(tune_args[1], state) and tune_args[1].data_ptr() != state.data_ptr()
    assert len(ran) == 1 and ran[0][0] == {"BR": 32, "BC": 128, "num_warps": 4} and ran[0][1][1] is state
    tuner_saw.clear(), ran.clear()
    tuned.launch(lambda meta: (1,), (x, state, out), stateful=(1,), DELAYED=True)  # picked: no tuning again
    assert tuner_saw == [] and len(ran) == 1
    tuned.launch(lambda meta: (1,), (x, state, out), DELAYED=False)  # a stateless launch: the tuner's run is it
    assert len(tuner_saw) == 1 and tuner_saw[0][1] is state and len(ran) == 1


def test_delayed_cast_most_recent_and_first_call():
    st = F8.DelayedScaling(history_len=16, margin=0, algo="most_recent").history()
    for a, w in zip([4.0, 1.0, 3.0], [4.0, 4.0, 1.0]):
        x = torch.zeros(20, 32, device=DEV, dtype=torch.bfloat16)
        x[3, 3] = a
        _, _, sinv = F8.cast_tensorwise(x, E4, want_y=True, want_t=False, history=st)
        assert sinv.item() == pytest.approx(w / 448.0, rel=1e-6)
    with pytest.raises(ValueError, match="amax compute algo"):
        F8.DelayedScaling(algo="mean")
    with pytest.raises(ValueError, match="history_len"):
        F8.DelayedScaling(history_len=0)


@pytest.mark.parametrize("fmt", ["e4m3", "hybrid"])
def test_fp8_linear_delayed_trains_within_the_fp8_band(fmt):
    """fp8_linear with the delayed recipe over several calls of similar data (the scales come from the earlier
    calls): forward and both gradients within the fp8 band of float64 at every call; the dy history too."""
    torch.manual_seed(0)
    M, K, N = 50, 64, 48
    w = (torch.randn(N, K, device=DEV) / K ** 0.5).to(torch.bfloat16).requires_grad_()
    state = F8.DelayedScaling(history_len=4).linear_state()
    with pytest.raises(ValueError, match="DelayedLinearState"):
        F8.fp8_linear(torch.randn(4, K, device=DEV, dtype=torch.bfloat16), w, None, "delayed")
    gband = 0.15 if fmt == "hybrid" else 0.08
    for _ in range(3):
        x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
        w.grad = None
        y = F8.fp8_linear(x, w, None, "delayed", fmt, state)
        y.backward(dy)
        xd, wd = x.detach().double(), w.detach().double()
        assert relerr(y, xd @ wd.t()) < 0.08
        assert relerr(x.grad, dy.double() @ wd) < gband
        assert relerr(w.grad, dy.double().t() @ xd) < gband
    assert [h.calls for h in (state.x, state.w, state.dy)] == [3, 3, 3]
    assert (state.dy.amax_history > 0).sum().item() == 3  # every backward cast recorded


@pytest.mark.parametrize("path", ["eager", "custom_ops"])
@pytest.mark.parametrize("reentrant", [True, False])
def test_delayed_recompute_replays_the_forward_bit_for_bit_and_records_it_once(path, reentrant):
    """Activation recompute replays each forward inside the backward (use_reentrant=True is megatron's
    CheckpointFunction: a no-grad forward, then the replay). The replayed casts reuse the operands' last scales and
    record nothing: two checkpointed fp8 linears give the un-checkpointed run's outputs, gradients and amax
    histories bit for bit, step after step, and every history counts one cast per step."""
    from torch.utils.checkpoint import checkpoint

    from primus.turbo import fp8_ops

    torch.manual_seed(0)
    K, H, N, M = 64, 96, 48, 40
    settings = F8.DelayedScaling(history_len=4, margin=0, algo="max")
    w0 = [(torch.randn(H, K, device=DEV) / 8).to(torch.bfloat16), (torch.randn(N, H, device=DEV) / 8).to(torch.bfloat16)]

    def run(ckpt: bool):
        ws = [w.clone().requires_grad_() for w in w0]
        states = [settings.linear_state().allocate(DEV) for _ in ws]

        def block(x):
            for w, s in zip(ws, states):
                x = (F8.fp8_linear(x, w, None, "delayed", "e4m3", s) if path == "eager"
                     else fp8_ops.fp8_linear_traced(x, w, None, "delayed", "e4m3", delayed=s))
            return x

        out = []
        for step in range(3):
            g = torch.Generator(device="cpu").manual_seed(step)
            x = (torch.randn(M, K, generator=g) * (1 + step)).to(DEV, torch.bfloat16).requires_grad_()
            dy = torch.randn(M, N, generator=g).to(DEV, torch.bfloat16)
            y = checkpoint(block, x, use_reentrant=reentrant) if ckpt else block(x)
            y.backward(dy)
            out.append((y.detach(), x.grad, *[w.grad.clone() for w in ws]))
            for w in ws:
                w.grad = None
        return out, states

    got, s_got = run(True)
    want, s_want = run(False)
    for step, (a, b) in enumerate(zip(got, want)):
        assert all(torch.equal(u, v) for u, v in zip(a, b)), step
    for sg, sw in zip(s_got, s_want):
        for h, r in ((sg.x, sw.x), (sg.w, sw.w), (sg.dy, sw.dy)):
            assert h.calls == 3 and torch.equal(h.buf, r.buf) and torch.equal(h.meta, r.meta)
    assert not F8.replaying_forward()


@pytest.mark.parametrize("path", ["eager", "custom_ops"])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise", "delayed"])
def test_weight_casts_are_reused_until_cleared(weight_casts, recipe, path):
    """WEIGHT_CASTS (the megatron trainer's fp8 weight cache): two micro batches with the cache give the uncached
    run's outputs and gradients bit for bit, the weight cast once (rowwise: W for the fprop, W^T for the dgrad).
    A weight changed in place through .data (as megatron's optimizer writes it) is served stale until clear(), then
    cast again: the cache is what serves the weight, and clear() is what makes a step see new weights."""
    from primus.turbo import fp8_ops

    torch.manual_seed(0)
    M, K, N = 50, 64, 48
    w0 = (torch.randn(N, K, device=DEV) / 8).to(torch.bfloat16)
    xs = [(torch.randn(M, K, device=DEV) * (1 + i)).to(torch.bfloat16) for i in range(3)]
    dys = [torch.randn(M, N, device=DEV).to(torch.bfloat16) for _ in range(3)]
    settings = F8.DelayedScaling(history_len=4)

    def run(cached: bool, w, state, i):
        weight_casts.enabled = cached
        x = xs[i].clone().requires_grad_()
        y = (F8.fp8_linear(x, w, None, recipe, "e4m3", state) if path == "eager"
             else fp8_ops.fp8_linear_traced(x, w, None, recipe, "e4m3", delayed=state))
        y.backward(dys[i])
        out = (y.detach().clone(), x.grad, w.grad.clone())
        w.grad = None
        return out

    w_c, w_u = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    s_c, s_u = [(settings.linear_state().allocate(DEV) if recipe == "delayed" else None) for _ in range(2)]
    for i in range(2):  # two micro batches of one step
        got, want = run(True, w_c, s_c, i), run(False, w_u, s_u, i)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (recipe, i)
    forms = 2 if recipe == "rowwise" else 1
    assert (weight_casts.misses, weight_casts.hits) == (forms, forms)
    if recipe == "delayed":  # the weight's amax recorded by its first cast of the step only (TE's rule)
        assert s_c.w.calls == 1 and s_u.w.calls == 2 and s_c.x.calls == s_u.x.calls == 2

    # the optimizer step, as megatron writes it (no version bump)
    w_c.data.mul_(0.5)
    w_u.data.mul_(0.5)
    stale, fresh = run(True, w_c, s_c, 2), run(False, w_u, s_u, 2)
    assert not torch.equal(stale[0], fresh[0])
    weight_casts.clear()
    # the uncached reference starts from the cached run's delayed state: the scales come from the same histories
    # (a fresh state's would depend on which random dy had the largest amax)
    w_r = w0.clone().mul_(0.5).requires_grad_()
    s_r = None
    if recipe == "delayed":
        s_r = settings.linear_state()
        for copy, orig in ((s_r.x, s_c.x), (s_r.w, s_c.w), (s_r.dy, s_c.dy)):
            copy.buf, copy.meta = orig.buf.clone(), orig.meta.clone()
    redone, want = run(True, w_c, s_c, 2), run(False, w_r, s_r, 2)
    assert all(torch.equal(a, b) for a, b in zip(redone, want)), recipe
    assert weight_casts.misses == 2 * forms


def test_fp8_module_swap():
    torch.manual_seed(0)
    m = torch.nn.Module()
    m.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    m.output = torch.nn.Linear(32, 32)
    w0 = m.body[0].weight
    names = F8.swap_linears_to_fp8(m, "tensorwise", filter_fqns=["output"])
    assert names == ["body.0"]  # "body.2" has 10 outputs (not a multiple of 16), "output" is filtered
    assert isinstance(m.body[0], F8.FP8Linear) and m.body[0].weight is w0
    assert type(m.output) is torch.nn.Linear
    sd = m.state_dict()
    assert "body.0.weight" in sd and "body.0.bias" in sd
    x = torch.randn(8, 32, device=DEV).to(torch.bfloat16)
    m = m.to(DEV, torch.bfloat16)
    assert torch.isfinite(m.body(x)).all()


def test_available_signature():
    assert F8.fp8_linear_available("tensorwise") in (True, False)
    from primus.turbo import _common
    assert F8.fp8_linear_available("cpu") is _common.interpreting()  # CPU only through the interpreter
    assert F8.fp8_linear_available("mxfp8") is False
    assert F8.fp8_linear_available("mxfp8", "cpu") is False


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise"])
@pytest.mark.parametrize("M", [200, 256])
def test_fp8_custom_ops_fake_kernels_match_the_real_outputs(recipe, M):
    """The fake kernels of primus.turbo.fp8_ops declare every output's shape, dtype and strides as the real op
    returns them (torch.library.opcheck's fake-tensor test): inductor asserts them at run time, and blockwise's
    column-major W view and padded tile-scale view once declared contiguous failed there (not under aot_eager)."""
    from primus.turbo import fp8_ops

    x = torch.randn(M, 256, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(384, 256, device=DEV, dtype=torch.bfloat16)
    checks = ("test_faketensor",)  # test_schema would multiply the fp8 outputs, which CPU torch cannot
    assert torch.library.opcheck(fp8_ops.fp8_linear_fwd, (x, w, recipe, "e4m3"), test_utils=checks) == \
        {"test_faketensor": "SUCCESS"}
    y, a, b, c, d = fp8_ops.fp8_linear_fwd(x, w, recipe, "e4m3")
    saved = (x, w, c, d) if recipe == "rowwise" else (a, b, c, d)
    assert torch.library.opcheck(fp8_ops.fp8_linear_bwd, (torch.randn_like(y), *saved, recipe, "e4m3",
                                                          torch.bfloat16), test_utils=checks) == \
        {"test_faketensor": "SUCCESS"}


@pytest.mark.parametrize("M", [72])
def test_fp8_delayed_custom_ops_match_the_eager_linear_and_declare_their_mutations(M):
    """The delayed recipe's custom-op pair (fp8_ops): a linear run through it gives the eager autograd.Function's
    outputs, gradients and amax histories bit for bit, call after call (the first call's own amax, then the
    history); the fakes match the real outputs (opcheck); and the only inputs the ops change are the ones they
    declare mutated: the x and weight state in the forward, dy's in the backward."""
    from primus.turbo import fp8_ops

    K, N = 128, 96
    settings = F8.DelayedScaling(history_len=4, margin=1, algo="max")
    s_ops, s_ref = settings.linear_state().allocate(DEV), settings.linear_state()
    w0 = (torch.randn(N, K, device=DEV) / 16).to(torch.bfloat16)
    w, w_ref = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    for call in range(4):
        x0 = torch.randn(M, K, device=DEV, dtype=torch.bfloat16) * (1 + call)
        dy = torch.randn(M, N, device=DEV, dtype=torch.bfloat16) / (1 + call)
        x, x_ref = x0.clone().requires_grad_(), x0.clone().requires_grad_()
        y_ref = F8.fp8_linear(x_ref, w_ref, None, "delayed", "e4m3", s_ref)
        y = fp8_ops.fp8_linear_traced(x, w, None, "delayed", "e4m3", delayed=s_ops)
        y_ref.backward(dy)
        y.backward(dy)
        assert torch.equal(y, y_ref) and torch.equal(x.grad, x_ref.grad) and torch.equal(w.grad, w_ref.grad), call
        w.grad = w_ref.grad = None
    for h, r in ((s_ops.x, s_ref.x), (s_ops.w, s_ref.w), (s_ops.dy, s_ref.dy)):
        assert torch.equal(h.buf, r.buf) and torch.equal(h.meta, r.meta) and h.calls == 4
    checks = ("test_faketensor",)
    # a new weight amax (the same weight would leave its history's values as they were: only its count moves)
    fwd_in = (x0, w0 * 2, s_ops.x.buf, s_ops.x.meta, s_ops.w.buf, s_ops.w.meta, "e4m3", 4, 1, "max")
    assert torch.library.opcheck(fp8_ops.fp8_linear_delayed_fwd, fwd_in, test_utils=checks) == \
        {"test_faketensor": "SUCCESS"}
    before = [t.clone() for t in fwd_in[:6]]
    y, a, b, c, d = fp8_ops.fp8_linear_delayed_fwd(*fwd_in)
    changed = [not torch.equal(t0, t) for t0, t in zip(before, fwd_in[:6])]
    assert changed == [False, False, True, True, True, True]  # x, w untouched; both histories and call counts
    bwd_in = (torch.randn_like(y), a, b, c, d, s_ops.dy.buf, s_ops.dy.meta, "e4m3", torch.bfloat16, 4, 1, "max")
    assert torch.library.opcheck(fp8_ops.fp8_linear_delayed_bwd, bwd_in, test_utils=checks) == \
        {"test_faketensor": "SUCCESS"}
    before = [t.clone() for t in bwd_in[:7]]
    fp8_ops.fp8_linear_delayed_bwd(*bwd_in)
    changed = [not (torch.equal(t0, t) if t.dtype.is_floating_point and t.dtype.itemsize > 1
                    else torch.equal(t0.view(torch.uint8), t.view(torch.uint8)) if t.dtype.itemsize == 1
                    else torch.equal(t0, t)) for t0, t in zip(before, bwd_in[:7])]
    assert changed == [False, False, False, False, False, True, True]
    with pytest.raises(ValueError, match="DelayedLinearState"):
        fp8_ops.fp8_linear_traced(x0, w0, None, "delayed", "e4m3")
    with pytest.raises(ValueError, match="take none"):
        fp8_ops.fp8_linear_traced(x0, w0, None, "tensorwise", "e4m3", delayed=s_ops)
