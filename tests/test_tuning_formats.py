"""File formats of the GEMM tuning workflow: shape jsonl, hipBLASLt bench logs, override/results files."""
import pytest

from tuning import bench_log
from tuning.gemm_problem import GemmProblem, read_shapes, write_shapes
from tuning.results_file import (CUDA_EXTRA_COLUMNS, HIPBLASLT_COLUMNS, append_row, latest_rows_by_key,
                                 problem_from_row, read_results, row_from_problem)

# The documented log line format (hipBLASLt with HIPBLASLT_LOG_MASK=32).
LOG_LINE = ("hipblaslt-bench --api_method c -m 1024 -n 512 -k 1024 --lda 1024 --ldb 1024 --ldc 1024 --ldd 1024 "
            "--stride_a 0 --stride_b 0 --stride_c 0 --stride_d 0 --alpha 1.000000 --beta 0.000000 --transA T "
            "--transB N --batch_count 1 --scaleA 0 --scaleB 0 --a_type bf16_r --b_type bf16_r --c_type bf16_r "
            "--d_type bf16_r --scale_type f32_r --bias_type f32_r --compute_type f32_r --activation_type none "
            "--algo_method index --solution_index 56073")
# A newer line: value-less --bias_vector followed by a flag with a value.
LOG_LINE_BIAS = LOG_LINE.replace("-m 1024", "-m 4096").replace(
    "--activation_type none", "--activation_type none --bias_vector --bias_source d")

FULL_HEADER = ",".join(HIPBLASLT_COLUMNS)
FULL_VALUES = ("T,N,0,1,32,32768,2880,1,2880,92160,0,2880,94371840,32,1048576,32,1048576,bf16_r,bf16_r,f32_r,"
               "f32_r,f32_r,0,0,0,0,0,0,0,none,0,f32_r,f32_r,512,1,0,182699,5440.59,33.0588,24641,"
               "gfx950:sramecc+:xnack-,256")
OLD_HEADER = ("transA,transB,grouped_gemm,batch_count,m,n,k,alpha,lda,stride_a,beta,ldb,stride_b,ldc,stride_c,ldd,"
              "stride_d,a_type,b_type,c_type,d_type,compute_type,scaleA,scaleB,scaleD,amaxD,activation_type,"
              "bias_vector,bias_type,rotating_buffer,hipblaslt-Gflops,hipblaslt-GB/s,us,solution_index,"
              "gcnArchName,CUs")
OLD_VALUES = ("N,N,0,1,8192,2048,4096,1,8192,33554432,0,4096,8388608,8192,16777216,8192,16777216,bf16_r,bf16_r,"
              "bf16_r,bf16_r,f32_r,0,0,0,0,none,1,bf16_r,512,610000.5,1200.3,225.5,1234,gfx942:sramecc+:xnack-,304")


def test_override_file_full_and_old_columns(tmp_path):
    f = tmp_path / "tune_hipblas_gemm_results.txt"
    f.write_text(f"Git Version: 1a2b3c4d\n    {FULL_HEADER}\n    {FULL_VALUES}\n    {OLD_HEADER}\n    {OLD_VALUES}\n")
    res = read_results(f)
    assert res.git_version == "1a2b3c4d"
    assert len(HIPBLASLT_COLUMNS) == 42 and len(OLD_HEADER.split(",")) == 36
    full, old = res.rows
    assert (full["m"], full["n"], full["k"], full["solution_index"], full["us"]) == ("32", "32768", "2880", "24641",
                                                                                    "33.0588")
    assert full["gcnArchName"] == "gfx950:sramecc+:xnack-" and full["flush"] == "1"
    # the older row has no swizzle/aux/flush columns; values are found by name, not position
    assert "swizzle_a" not in old and old["solution_index"] == "1234" and old["CUs"] == "304"
    p_old = problem_from_row(old)
    assert (p_old.transA, p_old.m, p_old.n, p_old.k, p_old.bias_vector, p_old.bias_type) == ("N", 8192, 2048, 4096,
                                                                                            1, "bf16_r")
    p_full = problem_from_row(full)
    assert (p_full.transA, p_full.lda, p_full.c_type, p_full.stride_b) == ("T", 2880, "f32_r", 94371840)


def test_override_file_reordered_columns_parse_by_name(tmp_path):
    cols, vals = FULL_HEADER.split(","), FULL_VALUES.split(",")
    order = list(reversed(range(len(cols))))
    f = tmp_path / "r.txt"
    f.write_text("Git Version: x\n    " + ",".join(cols[i] for i in order) + "\n    "
                 + ",".join(vals[i] for i in order) + "\n")
    (row,) = read_results(f).rows
    assert row["m"] == "32" and row["solution_index"] == "24641"


def test_override_file_value_count_mismatch_is_an_error(tmp_path):
    f = tmp_path / "r.txt"
    f.write_text(f"Git Version: x\n    {FULL_HEADER}\n    T,N,0\n")
    with pytest.raises(ValueError, match="3 values for 42 header columns"):
        read_results(f)


def test_results_round_trip_with_cuda_columns(tmp_path):
    p = GemmProblem("T", "N", 2048, 8192, 2048, 2048, 2048, 2048, 2048, bias_vector=1, bias_type="bf16_r")
    row = row_from_problem(p, us=101.5, arch="NVIDIA H200", cus=132, rotating_mb=512)
    assert list(row) == HIPBLASLT_COLUMNS
    row.update({"library": "cublasLt", "library_version": 130100, "algo_id": 66, "tile_id": 0, "splitk_num": 1,
                "reduction_scheme": 0, "cta_swizzling": 1, "custom_option": 0, "stages_id": 0, "inner_shape_id": 7,
                "cluster_shape_id": 2, "default_us": "110.0", "heuristic_us": "108.0"})
    assert set(CUDA_EXTRA_COLUMNS) <= set(row)
    f = tmp_path / "sub" / "results.txt"
    append_row(f, row, "cublasLt-130100")
    append_row(f, dict(row, us="99.0"), "ignored-after-first-line")
    text = f.read_text().splitlines()
    assert text[0] == "Git Version: cublasLt-130100"
    assert all(line.startswith("    ") for line in text[1:]) and len(text) == 5
    res = read_results(f)
    assert len(res.rows) == 2 and res.rows[0]["inner_shape_id"] == "7" and res.rows[0]["gcnArchName"] == "NVIDIA H200"
    assert problem_from_row(res.rows[0]).tune_key() == p.tune_key()
    (only,) = latest_rows_by_key(res).values()  # the same problem twice: the later row wins
    assert only["us"] == "99.0"


def test_bench_line_parse_with_valueless_flags():
    pairs = bench_log.split_bench_line("[12:00] " + LOG_LINE_BIAS)
    flags = dict(pairs)
    assert flags["--bias_vector"] is None and flags["--bias_source"] == "d"
    assert flags["-m"] == "4096" and flags["--alpha"] == "1.000000"
    p = bench_log.problem_from_bench_line(LOG_LINE_BIAS)
    assert (p.m, p.n, p.k, p.transA, p.transB, p.lda, p.bias_vector) == (4096, 512, 1024, "T", "N", 1024, 1)
    q = bench_log.problem_from_bench_line(LOG_LINE)
    assert q.bias_vector == 0 and q.a_type == "bf16_r" and q.compute_type == "f32_r" and q.batch_count == 1
    # a value-less flag at the very end of the line
    assert dict(bench_log.split_bench_line(LOG_LINE + " --print_kernel_info"))["--print_kernel_info"] is None
    # negative numbers are values, not flags
    assert dict(bench_log.split_bench_line("hipblaslt-bench --requested_solution -1 -m 8"))["--requested_solution"] == "-1"


def test_bench_line_rejects_garbage():
    assert bench_log.split_bench_line("nothing here") is None
    with pytest.raises(ValueError):
        bench_log.problem_from_bench_line("hipblaslt-bench --transA T")


def test_log_dedupe_counts_and_tuning_command(tmp_path):
    log = tmp_path / "dump_hipblaslt_gemm_shape_0.txt"
    log.write_text("\n".join([LOG_LINE, LOG_LINE, "unrelated line", LOG_LINE.replace("  ", " "), LOG_LINE_BIAS]) + "\n")
    problems = {p.m: p for p in bench_log.problems_from_logs([log])}
    assert set(problems) == {1024, 4096}
    assert problems[1024].count == 3 and problems[4096].count == 1
    argv = bench_log.tuning_argv(problems[1024].bench_line)
    assert "--algo_method" not in argv and "--solution_index" not in argv and "56073" not in argv
    assert argv[0] == "hipblaslt-bench"
    assert argv[-len(bench_log.TUNE_FLAGS):] == bench_log.TUNE_FLAGS
    assert " ".join(bench_log.TUNE_FLAGS) == ("--requested_solution -1 --skip_slow_solution_ratio 0.7 --rotating 512 "
                                             "--cold_iters 20 --iters 20 --print_kernel_info")
    base = bench_log.default_timing_argv(problems[1024].bench_line)
    assert base[base.index("--solution_index") + 1] == "56073"
    # a problem recorded by the torch recorder becomes a bench line that parses back to itself
    p = problems[4096]
    again = bench_log.problem_from_bench_line(bench_log.bench_line_from_problem(p))
    assert again.tune_key() == p.tune_key()


def test_shapes_jsonl_round_trip(tmp_path):
    ps = [GemmProblem("T", "N", 16, 15, 8, 8, 8, 16, 16, count=2.0, source="aten.addmm", bias_vector=1),
          GemmProblem("N", "T", 8, 16, 15, 8, 16, 8, 8, batch_count=3, stride_a=120, stride_b=240, stride_c=128,
                      stride_d=128, count=0.5)]
    f = write_shapes(tmp_path / "s.jsonl", ps, meta={"rank": 3, "steps": 2})
    meta, back = read_shapes(f)
    assert meta["rank"] == 3 and meta["steps"] == 2
    assert back == ps
    (tmp_path / "bad.jsonl").write_text('{"format": "something-else"}\n')
    with pytest.raises(ValueError, match="unknown shapes format"):
        read_shapes(tmp_path / "bad.jsonl")
