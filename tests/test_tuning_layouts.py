"""The cuBLAS-terms mapping the CUDA tuner relies on, checked on CPU against a column-major reference GEMM.

For each recorded problem the tuner fills flat A/B/C/D buffers, runs cuBLASLt on them and compares with the
torch call training made (`_torch_views`). Here a reference column-major GEMM stands in for cuBLASLt: if the
mapping (transposes, leading dims, batch strides, output view) were wrong, the two would disagree.
"""
import pytest
import torch

from tuning.cuda_tuner import CudaLtTuner, buffer_elems
from tuning.shapes import record_gemms


def colmajor_gemm(p, s):
    def mat(flat, rows, cols, ld, stride):
        if p.batch_count == 1:
            return flat.as_strided((rows, cols), (1, ld))
        return flat.as_strided((p.batch_count, rows, cols), (stride, 1, ld))

    ar, ac = (p.m, p.k) if p.transA == "N" else (p.k, p.m)
    br, bc = (p.k, p.n) if p.transB == "N" else (p.n, p.k)
    A = mat(s["a"], ar, ac, p.lda, p.stride_a)
    B = mat(s["b"], br, bc, p.ldb, p.stride_b)
    opA = A if p.transA == "N" else A.transpose(-1, -2)
    opB = B if p.transB == "N" else B.transpose(-1, -2)
    D = p.alpha * (opA @ opB)
    if p.beta:
        D = D + p.beta * mat(s["c"], p.m, p.n, p.ldc, p.stride_c)
    if p.bias_vector:
        D = D + s["bias"][:, None]
    mat(s["d"], p.m, p.n, p.ldd, p.stride_d).copy_(D)


def _recorded():
    torch.manual_seed(0)
    lin_b = torch.nn.Linear(12, 20)
    lin = torch.nn.Linear(20, 6, bias=False)
    x = torch.randn(2, 7, 12, requires_grad=True)
    a, b, c = torch.randn(3, 5, 4), torch.randn(3, 4, 6), torch.randn(3, 5, 6)
    with record_gemms(None) as rec:
        lin(torch.tanh(lin_b(x))).pow(2).sum().backward()
        torch.bmm(a, b)
        torch.baddbmm(c, a, b, beta=0.5)
        torch.addmm(torch.randn(5, 6), a[0], b[0], beta=2.0)
        torch.mm(a[0].t().contiguous().t(), b[0])  # column-major left operand
    return rec.results()


@pytest.mark.parametrize("p", _recorded(), ids=lambda p: p.label().replace(" ", "_"))
def test_torch_call_matches_column_major_reference(p):
    g = torch.Generator().manual_seed(1)
    na, nb, nc, nd = buffer_elems(p)
    s = {"a": torch.randn(na, generator=g), "b": torch.randn(nb, generator=g), "d": torch.zeros(nd)}
    s["c"] = torch.randn(nc, generator=g) if p.beta else s["d"]
    if p.bias_vector:
        s["bias"] = torch.randn(p.m, generator=g)
    call = CudaLtTuner._torch_views(p, s)
    assert call is not None
    colmajor_gemm(p, s)
    torch.testing.assert_close(CudaLtTuner._lt_output(p, s["d"]), call())


def test_recorded_set_covers_all_layouts():
    kinds = {(p.transA, p.transB, p.batch_count > 1, bool(p.bias_vector), p.beta != 0) for p in _recorded()}
    assert ("T", "N", False, True, False) in kinds      # linear forward with bias
    assert ("N", "N", False, False, False) in kinds     # dgrad
    assert ("N", "T", False, False, False) in kinds     # wgrad
    assert ("N", "N", True, False, True) in kinds       # baddbmm


class FakeLt:
    """Just enough of tuning.lt_bindings.Lt for the candidate generator: algorithms are dicts in a buffer."""

    def __init__(self):
        self.checked = 0

    def _algo(self, cfg):
        return _FakeAlgo(dict(cfg))

    def get_config(self, algo):
        from tuning.results_file import CUBLASLT_ALGO_COLUMNS
        return {c: algo.cfg.get(c, 0) for c in CUBLASLT_ALGO_COLUMNS}

    def algo_ids(self, h, p):
        return [10, 20, 30]

    def algo_init(self, h, p, algo_id):
        return None if algo_id == 30 else self._algo({"algo_id": algo_id})

    def set_config(self, algo, cfg):
        from tuning.lt_bindings import LtError
        if cfg.get("splitk_num", 1) == 16:
            raise LtError("not for this algorithm")
        algo.cfg.update(cfg)

    def cap_list(self, algo, cap):
        return {"TILE_IDS": [1, 2, 3], "STAGES_IDS": [7, 8]}[cap]

    def cap_int(self, algo, cap, default=0):
        return {"SPLITK_SUPPORT": 1, "REDUCTION_SCHEME_MASK": 3, "CTA_SWIZZLING_SUPPORT": 1}.get(cap, default)

    def algo_check(self, h, descs, algo):
        self.checked += 1
        return None if algo.cfg.get("tile_id") == 3 else 1024


class _FakeAlgo:
    def __init__(self, cfg):
        self.cfg = cfg


def test_candidate_generator_order_dedupe_and_checks():
    from tuning.cuda_tuner import CudaLtTuner
    from tuning.gemm_problem import GemmProblem
    lt = FakeLt()
    tuner = object.__new__(CudaLtTuner)
    tuner.lt, tuner.handle, tuner.max_candidates, tuner.ws_bytes, tuner.seed = lt, 1, 64, 1 << 25, 0
    heur = [lt._algo({"algo_id": 10, "tile_id": 1, "stages_id": 7}), lt._algo({"algo_id": 20, "tile_id": 2}),
            lt._algo({"algo_id": 10, "tile_id": 1, "stages_id": 7})]  # a duplicate
    p = GemmProblem("T", "N", 64, 64, 64, 64, 64, 64, 64)
    cands = list(tuner._candidates(p, None, heur))
    sources = [c.source for c in cands]
    assert sources[:2] == ["heuristic", "heuristic"]  # the duplicate is dropped
    assert {"variant", "enumerated"} <= set(sources[2:])
    idents = [tuple(sorted(c.config.items())) for c in cands]
    assert len(idents) == len(set(idents))
    assert all(c.config["tile_id"] != 3 for c in cands if c.source == "enumerated")  # AlgoCheck rejects tile 3
    assert all(c.config["splitk_num"] != 16 for c in cands)  # set_config failures are skipped, not fatal
    splits = {c.config["splitk_num"]: c.config["reduction_scheme"] for c in cands if c.source == "variant"}
    assert splits[4] == 2 and splits.get(1, 0) == 0  # split-k > 1 gets a supported reduction scheme
    enumerated = {(c.config["algo_id"], c.config["tile_id"], c.config["stages_id"]) for c in cands
                  if c.source == "enumerated"}
    assert {a for a, _, _ in enumerated} == {10, 20}  # round-robin reaches every algorithm id


class FakeTimedLt(FakeLt):
    def __init__(self, heuristic):
        super().__init__()
        self.heur = heuristic

    def create_preference(self, ws, min_alignment=None):
        return 1

    def destroy_preference(self, pref):
        pass

    def heuristics(self, h, descs, pref, n):
        return list(self.heur)

    def git_version(self):
        return "cublasLt-1"


class FakeEvent:
    clock = [0.0]

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = FakeEvent.clock[0]

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return end.t - self.t


def test_tune_flow_picks_fastest_correct_candidate(monkeypatch):
    """The CUDA tuner's decision logic on CPU: GEMMs by a reference, time from a fake clock."""
    from tuning.gemm_problem import GemmProblem
    from tuning.tune_journal import TUNED

    heur = [_FakeAlgo({"algo_id": 10, "tile_id": 1, "stages_id": 7}), _FakeAlgo({"algo_id": 20, "tile_id": 1})]
    default_cfg = FakeLt().get_config(heur[0])

    def wrong(cfg):  # a wrong result: must be rejected, however fast
        return cfg["algo_id"] == 20 and cfg["stages_id"] == 8

    def cost(cfg):  # ms per call
        if wrong(cfg):
            return 0.1
        if cfg["splitk_num"] == 4:
            return 0.7
        return 1.0 if cfg == default_cfg else 1.2

    tuner = _flow_tuner(monkeypatch, heur, cost, {}, wrong=wrong)
    p = GemmProblem("T", "N", 32, 24, 16, 16, 16, 32, 32, a_type="f32_r", b_type="f32_r", c_type="f32_r",
                    d_type="f32_r", bias_vector=1, bias_type="f32_r")
    o = tuner._tune(p, None)
    assert o.status == TUNED, o.detail
    assert o.row["splitk_num"] == 4 and o.row["library"] == "cublasLt" and o.row["gcnArchName"] == "Fake GPU"
    assert o.tuned_us == pytest.approx(700) and o.default_us == pytest.approx(1000)
    assert float(o.row["heuristic_us"]) == pytest.approx(1000) and o.rejected >= 1
    assert o.candidates + o.rejected <= 40

    tuner.min_gain = 0.5  # 30% faster is not enough now: training keeps the default
    o = tuner._tune(p, None)
    assert o.status == "default" and o.row is None and o.tuned_us == o.default_us


def _flow_tuner(monkeypatch, heur, cost, calls, wrong=None, **attrs):
    """A CudaLtTuner on CPU: GEMMs by the reference, each call advances a fake clock by cost(full config) ms and
    is counted in calls[config ident] (torch's own calls under "torch", 1 ms each); configs `wrong(cfg)` accepts
    return a corrupted result."""
    from tuning.cuda_tuner import CudaLtTuner
    lt = FakeTimedLt(heur)
    tuner = object.__new__(CudaLtTuner)
    tuner.__dict__.update(lt=lt, handle=1, device=0, buffer_device=torch.device("cpu"), max_candidates=40, warmup=1,
                          iters=3, rotating_bytes=1 << 16, rotating_mb=1, min_gain=0.01, confirm_top=3,
                          ws_bytes=1 << 25, seed=0, gpu_name="Fake GPU", sms=10, lib_version=1,
                          spin_cycles_per_iter=0)
    tuner.__dict__.update(attrs)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)

    def runner(p, descs, sets):
        def run(algo, i, out=None):
            s = dict(sets[i])
            if out is not None:
                s["d"] = out
            colmajor_gemm(p, s)
            cfg = lt.get_config(algo)
            if wrong is not None and wrong(cfg):
                s["d"].add_(1.0)
            ident = tuple(sorted(cfg.items()))
            calls[ident] = calls.get(ident, 0) + 1
            FakeEvent.clock[0] += cost(cfg)
        return run

    orig_views = CudaLtTuner._torch_views

    def timed_views(p, s):
        call = orig_views(p, s)

        def run():
            calls["torch"] = calls.get("torch", 0) + 1
            FakeEvent.clock[0] += 1.0
            return call()
        return run

    monkeypatch.setattr(tuner, "_lt_runner", runner)
    monkeypatch.setattr(CudaLtTuner, "_torch_views", staticmethod(timed_views))
    return tuner


def test_tune_flow_prunes_slow_candidates_and_sizes_timing_by_budget(monkeypatch):
    from tuning.cuda_tuner import QUICK_ITERS
    from tuning.gemm_problem import GemmProblem
    from tuning.tune_journal import TUNED

    heur = [_FakeAlgo({"algo_id": 10, "tile_id": 1, "stages_id": 7}), _FakeAlgo({"algo_id": 20, "tile_id": 1})]
    default_cfg = FakeLt().get_config(heur[0])

    def cost(cfg):  # ms per call
        if cfg["splitk_num"] == 4:
            return 0.7
        if cfg == default_cfg:
            return 1.0
        return 3.0 if cfg["tile_id"] == 2 else 1.2

    calls = {}
    # budget 6 ms: 1.0 ms -> 6 timed calls (2 warm-ups = ceil(5 * 6 / 20)), 0.7 -> 8 (2), 1.2 -> 5 (2)
    tuner = _flow_tuner(monkeypatch, heur, cost, calls, iters=20, warmup=5, time_budget_s=0.006)
    p = GemmProblem("T", "N", 32, 24, 16, 16, 16, 32, 32, a_type="f32_r", b_type="f32_r", c_type="f32_r",
                    d_type="f32_r")
    o = tuner._tune(p, None)
    assert o.status == TUNED and o.row["splitk_num"] == 4 and o.tuned_us == pytest.approx(700)

    by_cost: dict[float, list[int]] = {}
    for ident, n in calls.items():
        if ident != "torch":
            by_cost.setdefault(cost(dict(ident)), []).append(n)
    quick = 1 + QUICK_ITERS  # the correctness call and the quick estimate
    pruned = sum(n == quick for ns in by_cost.values() for n in ns)
    assert by_cost[3.0] and all(n == quick for n in by_cost[3.0])   # 3x slower: never fully timed
    # 1.2 ms: timed in full (5 + 2 calls) while the best was 1.0 ms, pruned once a 0.7 ms one was timed
    assert quick in by_cost[1.2] and (quick + 2 + 5) in by_cost[1.2]
    # the default (never pruned): reference + correctness + estimate + 2 + 6, then 3 confirm rounds of 2 + 6
    assert by_cost[1.0] == [1 + quick + 2 + 6 + 3 * (2 + 6)]
    assert by_cost[0.7] == [quick + 2 + 8 + 3 * (2 + 8)] * 2          # both split-k 4 variants are finalists
    assert calls["torch"] == 1 + 3 * (2 + 6)                          # torch's call with the default's plan
    assert f"{pruned} pruned" in o.detail and pruned >= 5
    assert o.candidates == sum(n > quick for ns in by_cost.values() for n in ns)
    assert o.candidates + o.rejected + pruned <= 40


def test_tune_flow_never_prunes_the_heuristic_default(monkeypatch):
    """Even when a much faster candidate was timed before it, heuristic[0] is timed in full: it is the reference."""
    from tuning.cuda_tuner import CudaLtTuner, _Candidate
    from tuning.gemm_problem import GemmProblem

    heur = [_FakeAlgo({"algo_id": 10, "tile_id": 1}), _FakeAlgo({"algo_id": 20, "tile_id": 1})]
    fast = _FakeAlgo({"algo_id": 30, "tile_id": 5})
    slow = _FakeAlgo({"algo_id": 40, "tile_id": 5})
    costs = {10: 2.0, 20: 0.6, 30: 0.5, 40: 2.0}
    calls = {}
    tuner = _flow_tuner(monkeypatch, heur, lambda cfg: costs[cfg["algo_id"]], calls)
    order = [fast, heur[0], slow, heur[1]]
    monkeypatch.setattr(CudaLtTuner, "_candidates", lambda self, p, d, h: (
        _Candidate(a, tuner.lt.get_config(a), "heuristic" if a in heur else "enumerated") for a in order))
    p = GemmProblem("T", "N", 32, 24, 16, 16, 16, 32, 32, a_type="f32_r", b_type="f32_r", c_type="f32_r",
                    d_type="f32_r")
    o = tuner._tune(p, None)
    n = {dict(k)["algo_id"]: v for k, v in calls.items() if k != "torch"}
    assert n[40] == 3                       # as slow as heuristic[0], but only heuristic[0] is exempt
    assert n[10] > 3 and "1 pruned" in o.detail
    assert o.status == "tuned" and o.row["algo_id"] == 30 and o.tuned_us == pytest.approx(500)
    assert float(o.row["heuristic_us"]) == pytest.approx(2000)  # the default was measured, not skipped
    assert o.candidates == 3
