"""Stand-ins for the CUDA side of GEMM tuning stage 3, for CPU tests."""
import torch

from tuning.results_file import CUBLASLT_ALGO_COLUMNS, row_from_problem


class FakeExecutor:
    """Stands in for cuBLASLt: answers tuned problems with torch's result and remembers which ran."""

    def __init__(self):
        self.table, self.seen = {}, []

    def run(self, a, b, bias):
        from tuning.gemm_problem import problem_from_matmul
        key = problem_from_matmul(a, b, bias=bias).tune_key()
        if key not in self.table:
            return None
        self.seen.append(key)
        return torch.addmm(bias, a, b) if bias is not None else torch.mm(a, b)


def cuda_row(p, version=130100, gpu="NVIDIA H200"):
    """A results-file row as the CUDA tuner writes it (algorithm columns filled)."""
    row = row_from_problem(p, us=10.0, arch=gpu, cus=132)
    row.update({"library": "cublasLt", "library_version": version, **{c: 1 for c in CUBLASLT_ALGO_COLUMNS},
                "default_us": "11", "heuristic_us": "11"})
    return row
