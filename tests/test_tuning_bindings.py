"""The cuBLASLt / hipBLASLt binding layer: one table of per-library constants, a clear error without a GPU."""
import os

import pytest
import torch

from tuning.lt_bindings import Lt
from tuning.lt_library import CUBLASLT, HIPBLASLT, LtLibraryNotFound, candidate_paths, load_library, mapped_paths

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")


@pytest.mark.e2e
@no_gpu
def test_missing_library_is_a_clear_error():
    with pytest.raises(LtLibraryNotFound) as err:
        Lt.load()
    msg = str(err.value)
    # names what it looked for, for both libraries on a CPU build, and where
    assert "cuBLASLt" in msg and "hipBLASLt" in msg
    assert "libcublasLt.so" in msg and "libhipblaslt.so" in msg
    assert "/proc/self/maps" in msg and "/opt/rocm/lib" in msg and "nvidia/cu13/lib" in msg


@pytest.mark.e2e
@no_gpu
def test_explicit_library_choice_errors_name_only_that_library():
    with pytest.raises(LtLibraryNotFound) as err:
        load_library("hipblaslt")
    assert "hipBLASLt" in str(err.value) and "cublasLt" not in str(err.value)
    with pytest.raises(ValueError, match="unknown library"):
        load_library("mkl")


@pytest.mark.e2e
def test_already_loaded_copy_comes_first():
    maps = ("7f00-7f01 r-xp 00000000 08:01 1234 /opt/venv/site-packages/nvidia/cu13/lib/libcublasLt.so.13\n"
            "7f01-7f02 r--p 00000000 08:01 1234 /opt/venv/site-packages/nvidia/cu13/lib/libcublasLt.so.13\n"
            "7f02-7f03 r-xp 00000000 08:01 99 /usr/lib/libc.so.6\n")
    assert mapped_paths(CUBLASLT, maps) == ["/opt/venv/site-packages/nvidia/cu13/lib/libcublasLt.so.13"]
    paths = candidate_paths(CUBLASLT, maps)
    assert paths[0] == "/opt/venv/site-packages/nvidia/cu13/lib/libcublasLt.so.13"
    assert len(paths) == len(set(paths))
    assert mapped_paths(HIPBLASLT, maps) == []


def test_one_table_two_libraries():
    # every logical constant the binding uses exists for both libraries; only values differ
    for attr in ("TRANSA", "TRANSB", "EPILOGUE", "BIAS_POINTER", "BIAS_DATA_TYPE"):
        assert attr in CUBLASLT.desc_attr and attr in HIPBLASLT.desc_attr
    assert set(HIPBLASLT.layout_attr) == set(CUBLASLT.layout_attr)
    assert (CUBLASLT.op, HIPBLASLT.op) == ({"N": 0, "T": 1}, {"N": 111, "T": 112})
    assert (CUBLASLT.desc_attr["TRANSA"], HIPBLASLT.desc_attr["TRANSA"]) == (3, 0)
    assert (CUBLASLT.compute_32f, HIPBLASLT.compute_32f) == (68, 2)
    assert CUBLASLT.dtypes["bf16_r"] == HIPBLASLT.dtypes["bf16_r"] == 14
    # struct sizes: algo + size_t workspace + int state + float waves + int reserved[4]
    assert (CUBLASLT.algo_size, CUBLASLT.heuristic_size) == (64, 96)
    assert (HIPBLASLT.algo_size, HIPBLASLT.heuristic_size) == (24, 56)
    assert [n for n, _, _ in CUBLASLT.algo_config][:3] == ["algo_id", "tile_id", "splitk_num"]
    assert [e for _, e, _ in CUBLASLT.algo_config] == list(range(9))
    assert HIPBLASLT.algo_config == ()  # no enumeration through the C API: restore searches by solution index


def test_heuristic_results_parse_by_struct_layout():
    import struct
    lt = Lt(CUBLASLT, lib=None, path="(none)")
    rec = []
    for i, (ws, state) in enumerate(((1024, 0), (0, 7), (4096, 0))):
        rec.append(bytes([i + 1]) * 64 + struct.pack("<Qif", ws, state, 0.5) + b"\0" * 16)
    algos = lt._parse_heuristics(b"".join(rec), 3)
    assert [a.workspace_size for a in algos] == [1024, 4096]  # the failed state is dropped
    assert algos[1].raw() == bytes([3]) * 64 and algos[0].waves == 0.5


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="Linux only")
def test_maps_scan_of_this_process_finds_nothing_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("GPU machine")
    assert mapped_paths(CUBLASLT) == [] and mapped_paths(HIPBLASLT) == []


def test_block_scaled_fp8_problem_maps_each_scale_to_its_cublas_operand():
    """torch.nn.functional.scaled_mm's blockwise recipes as cuBLASLt problems: cuBLAS A is torch's right-hand
    operand, so scaleA describes b's scales. The enum values are the ones the H200's cublasLt.h (CUDA 13.0)
    spells (VEC128_32F 4, BLK128x128_32F 5, A/B_SCALE_MODE 31/32)."""
    from tuning.gemm_problem import SCALE_1X128, SCALE_128X128, problem_from_matmul
    from tuning.lt_bindings import LtError

    e4 = torch.float8_e4m3fn
    M, K, N = 256, 512, 384
    a = torch.empty(M, K, dtype=e4)
    b = torch.empty(N, K, dtype=e4).t()  # column-major, as the sm90 GEMM takes it
    sa, sb = torch.empty(K // 128, M).t(), torch.empty(N // 128, K // 128).t()
    p = problem_from_matmul(a, b, out_dtype=torch.bfloat16, scale_a=sa, scale_b=sb, block_a="1x128",
                            block_b="128x128")
    assert (p.transA, p.transB, p.m, p.n, p.k) == ("T", "N", N, M, K)
    assert (p.scaleA, p.scaleB) == (SCALE_128X128, SCALE_1X128)
    assert (p.a_type, p.d_type) == ("f8_r", "bf16_r")
    assert Lt(CUBLASLT, None, "cublasLt")._scale_modes(p) == (5, 4)
    assert (CUBLASLT.desc_attr["A_SCALE_MODE"], CUBLASLT.desc_attr["B_SCALE_MODE"]) == (31, 32)
    # tensorwise / rowwise: the scale's size says which (hipblaslt-bench's codes 1 and 2)
    pt = problem_from_matmul(a, b, out_dtype=torch.bfloat16, scale_a=torch.ones(()), scale_b=torch.ones(()))
    assert (pt.scaleA, pt.scaleB) == (1, 1) and Lt(CUBLASLT, None, "cublasLt")._scale_modes(pt) == (0, 0)
    with pytest.raises(LtError, match="not bound for hipBLASLt"):
        Lt(HIPBLASLT, None, "hipblaslt")._scale_modes(p)
    with pytest.raises(LtError, match="scales both operands"):
        Lt(CUBLASLT, None, "cublasLt")._scale_modes(problem_from_matmul(a, b, scale_a=sa, block_a="1x128"))
    with pytest.raises(ValueError, match="block scaling must be one of"):
        problem_from_matmul(a, b, scale_a=sa, scale_b=sb, block_a="1x32", block_b="1x128")
    assert p.tune_key() != pt.tune_key()  # an algorithm tuned for one scale mode never serves another
