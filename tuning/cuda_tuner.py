"""Stage 2 on CUDA: time cuBLASLt candidates for one GEMM problem on one GPU.

Candidates: the heuristic's list (at most 8 on an H200), then its top entries with other split-k / swizzle /
reduction settings, then algorithms enumerated from AlgoGetIds and their tile/stage capabilities; each checked
with AlgoCheck. Timing: CUDA events around each call, median, over a rotating set of buffers larger than L2 so a
problem is not timed from cache; the launches queue behind a GPU spin so ctypes launch cost never starves the
GPU. Every candidate's output is compared with the default algorithm's before it is timed.

Cost control (a big problem's slow candidates used to take minutes): each candidate is first timed with two calls;
one slower than `prune_factor` x the best full timing so far is pruned (the heuristic's first choice never is),
and the rest get as many timed calls as fit in `time_budget_s` (at least 3, at most `iters`). Output comparisons
go in chunks, so an output of many GB never gets a full-size fp32 copy.
"""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

import torch

from tuning.gemm_problem import GemmProblem
from tuning.lt_bindings import Algo, Lt, LtError
from tuning.results_file import CUBLASLT_ALGO_COLUMNS, row_from_problem
from tuning.tune_journal import DEFAULT, FAILED, SKIPPED, TUNED, TuneOutcome

TORCH_DTYPES = {"bf16_r": torch.bfloat16, "f16_r": torch.float16, "f32_r": torch.float32}
# Relative Frobenius error allowed against the default algorithm's output (split-k reorders the sums).
TOLERANCE = {"bf16_r": 2e-2, "f16_r": 1e-2, "f32_r": 1e-4}
ALIGNMENT = 256  # bytes; the apply path only routes tensors aligned like this
SPLITK_LADDER = (1, 2, 3, 4, 6, 8, 16)
REL_ERR_CHUNK_ELEMS = 64 << 20  # 256 MB per fp32 temporary in the output comparison
PRUNE_FACTOR = 1.25             # a candidate whose quick estimate is slower than this x the best is not timed
TIME_BUDGET_S = 0.15            # timed work per candidate (sets its number of timed calls)
QUICK_ITERS = 2                 # calls of the quick estimate (after the correctness call, which warms up)
MIN_ITERS = 3


def _chunks(x: torch.Tensor, ref: torch.Tensor, limit: int):
    """(x, ref) views of at most `limit` elements each, covering both, split along the leading dims."""
    if x.numel() <= limit or x.dim() == 0:
        yield x, ref
    elif x.dim() == 1:
        for s in range(0, x.shape[0], limit):
            yield x[s:s + limit], ref[s:s + limit]
    elif x[0].numel() > limit:
        for i in range(x.shape[0]):
            yield from _chunks(x[i], ref[i], limit)
    else:
        step = limit // x[0].numel()
        for s in range(0, x.shape[0], step):
            yield x[s:s + step], ref[s:s + step]


def rel_err(x: torch.Tensor, ref: torch.Tensor, chunk_elems: int = REL_ERR_CHUNK_ELEMS) -> float:
    """||x - ref|| / max(||ref||, 1e-30) (Frobenius), in chunks of at most `chunk_elems` elements: the fp32
    temporaries are chunk-sized, the squared norms add up in float64. NaN / inf give NaN / inf."""
    if x.shape != ref.shape:
        raise ValueError(f"shapes differ: {tuple(x.shape)} vs {tuple(ref.shape)}")
    chunk_elems = max(1, int(chunk_elems))
    diff_sq = ref_sq = torch.zeros((), dtype=torch.float64, device=ref.device)
    for xs, rs in _chunks(x, ref, chunk_elems):
        rf = rs.float()
        ref_sq = ref_sq + torch.linalg.vector_norm(rf).double().square()
        d = xs.to(torch.float32, copy=True)  # never x itself: it is changed in place
        d.sub_(rf)
        del rf
        diff_sq = diff_sq + torch.linalg.vector_norm(d).double().square()
        del d
    return float(diff_sq.sqrt() / ref_sq.sqrt().clamp_min(1e-30))


def should_prune(estimate_us: float, best_us: float, factor: float = PRUNE_FACTOR) -> bool:
    """Skip the full timing of a candidate whose quick estimate is over `factor` x the best timing so far."""
    return math.isfinite(best_us) and estimate_us > factor * best_us


def timing_plan(estimate_us: float, max_iters: int, max_warmup: int,
                budget_s: float = TIME_BUDGET_S) -> tuple[int, int]:
    """(timed calls, warm-up calls) for a candidate estimated at `estimate_us` per call: the timed calls fit in
    `budget_s`, clamped to [3, max_iters]; warm-ups in proportion, clamped to [1, max_warmup]."""
    lo = min(MIN_ITERS, max_iters)
    if not estimate_us > 0 or math.isnan(estimate_us):
        iters = max_iters
    elif math.isinf(estimate_us):
        iters = lo
    else:
        iters = min(max_iters, max(lo, math.floor(budget_s * 1e6 / estimate_us + 1e-9)))
    warmup = min(max_warmup, max(1, math.ceil(max_warmup * iters / max(max_iters, 1))))
    return iters, warmup


def buffer_elems(p: GemmProblem) -> tuple[int, int, int, int]:
    """Elements spanned by A, B, C, D (column-major with leading dims and batch strides)."""
    ar, ac = (p.m, p.k) if p.transA == "N" else (p.k, p.m)
    br, bc = (p.k, p.n) if p.transB == "N" else (p.n, p.k)
    extra = p.batch_count - 1
    return (p.lda * (ac - 1) + ar + extra * p.stride_a, p.ldb * (bc - 1) + br + extra * p.stride_b,
            p.ldc * (p.n - 1) + p.m + extra * p.stride_c, p.ldd * (p.n - 1) + p.m + extra * p.stride_d)


@dataclass
class _Candidate:
    algo: Algo
    config: dict
    source: str
    us: float = math.inf
    iters: int = 0      # timing plan from the quick estimate (0: the tuner's defaults)
    warmup: int = 0


class CudaLtTuner:
    prune_factor = PRUNE_FACTOR
    time_budget_s = TIME_BUDGET_S
    rel_err_chunk_elems = REL_ERR_CHUNK_ELEMS

    def __init__(self, device: int = 0, *, max_candidates: int = 64, warmup: int = 5, iters: int = 20,
                 rotating_mb: int = 512, min_gain: float = 0.01, workspace_mb: int = 32, confirm_top: int = 3,
                 seed: int = 0, prune_factor: float = PRUNE_FACTOR, time_budget_s: float = TIME_BUDGET_S):
        if not torch.cuda.is_available():
            raise RuntimeError("the CUDA tuner needs a CUDA GPU (torch.cuda.is_available() is False)")
        self.device = device
        self.buffer_device = torch.device("cuda", device)
        torch.cuda.set_device(device)
        self.lt = Lt.load("cublaslt")
        self.handle = self.lt.create_handle()
        self.max_candidates, self.warmup, self.iters = max_candidates, warmup, iters
        self.rotating_bytes, self.min_gain, self.confirm_top = rotating_mb << 20, min_gain, confirm_top
        self.rotating_mb = rotating_mb
        self.ws_bytes = workspace_mb << 20
        self.ws = torch.empty(self.ws_bytes, dtype=torch.uint8, device=f"cuda:{device}")
        self.seed = seed
        self.prune_factor, self.time_budget_s = prune_factor, time_budget_s
        props = torch.cuda.get_device_properties(device)
        self.gpu_name = props.name.replace(",", " ")
        self.sms = props.multi_processor_count
        self.lib_version = self.lt.version()
        # ~60 us of spin per timed call covers the CPU cost of launching it through ctypes.
        self.spin_cycles_per_iter = int(60e-6 * getattr(props, "clock_rate", 1_980_000) * 1e3)

    def git_version(self) -> str:
        return self.lt.git_version()

    # -- public --------------------------------------------------------------------------------------------------

    def tune_one(self, p: GemmProblem) -> TuneOutcome:
        why = self._unsupported(p)
        if why:
            return TuneOutcome(SKIPPED, detail=why, device=self.device)
        descs = self.lt.create_descs(p)
        try:
            with torch.cuda.device(self.device):
                return self._tune(p, descs)
        finally:
            self.lt.destroy_descs(descs)
            torch.cuda.empty_cache()

    def close(self) -> None:
        self.lt.destroy_handle(self.handle)

    # -- internals -----------------------------------------------------------------------------------------------

    @staticmethod
    def _unsupported(p: GemmProblem) -> str:
        types = {p.a_type, p.b_type, p.c_type, p.d_type}
        if not types <= set(TORCH_DTYPES):
            return f"types {sorted(types)} not tuned on CUDA (bf16/f16/f32 only)"
        if p.a_type != p.b_type:
            return "mixed input types"
        if p.scaleA or p.scaleB or p.activation_type != "none" or p.compute_type != "f32_r":
            return "scaled / activation / non-f32 compute GEMMs are not tuned on CUDA"
        return ""

    def _buffers(self, p: GemmProblem):
        """Flat A/B/C/D(/bias) buffers, enough sets to cover the rotating size."""
        dev = self.buffer_device
        na, nb, nc, nd = buffer_elems(p)
        dt = {k: TORCH_DTYPES[getattr(p, k + "_type")] for k in "abcd"}
        set_bytes = (na * dt["a"].itemsize + nb * dt["b"].itemsize + nd * dt["d"].itemsize
                     + (nc * dt["c"].itemsize if p.beta else 0))
        free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else 1 << 34
        nsets = max(1, min(64, math.ceil(self.rotating_bytes / max(set_bytes, 1)), int(0.5 * free // set_bytes)))
        gen = torch.Generator(device=dev).manual_seed(self.seed)

        def rnd(n, dtype):
            return torch.randn(n, generator=gen, device=dev, dtype=torch.float32).to(dtype)

        sets = []
        for _ in range(nsets):
            s = {"a": rnd(na, dt["a"]), "b": rnd(nb, dt["b"]), "d": torch.empty(nd, dtype=dt["d"], device=dev)}
            s["c"] = rnd(nc, dt["c"]) if p.beta else s["d"]
            if p.bias_vector:
                s["bias"] = rnd(p.m, TORCH_DTYPES.get(p.bias_type, dt["d"]))
            sets.append(s)
        return sets

    def _lt_runner(self, p, descs, sets, out_key="d"):
        lt, h, ws, wsb = self.lt, self.handle, self.ws.data_ptr(), self.ws_bytes

        def run(algo: Algo, i: int, out=None):
            s = sets[i]
            if p.bias_vector:
                lt.set_bias_pointer(descs, s["bias"].data_ptr())
            d = (out if out is not None else s[out_key]).data_ptr()
            c = s["c"].data_ptr() if p.beta else d
            lt.matmul(h, descs, algo, s["a"].data_ptr(), s["b"].data_ptr(), c, d, ws, wsb,
                      torch.cuda.current_stream().cuda_stream, beta=p.beta, alpha=p.alpha)
        return run

    @staticmethod
    def _torch_views(p: GemmProblem, s: dict):
        """The torch call training made for this problem, on buffer set s (None when not expressible)."""
        def view(flat, rows, cols, ld, op, batch_stride):
            # torch operand [rows, cols]: op N = row-major with ld, op T = column-major with ld
            size, stride = (rows, cols), ((ld, 1) if op == "N" else (1, ld))
            if p.batch_count > 1:
                size, stride = (p.batch_count,) + size, (batch_stride,) + stride
            return flat.as_strided(size, stride)

        x = view(s["b"], p.n, p.k, p.ldb, p.transB, p.stride_b)   # torch left operand  = cuBLAS B
        w = view(s["a"], p.k, p.m, p.lda, p.transA, p.stride_a)   # torch right operand = cuBLAS A
        bias = s.get("bias")
        if p.batch_count > 1:
            if bias is not None:
                return None
            if p.beta:
                c = view(s["c"], p.n, p.m, p.ldc, "N", p.stride_c)
                return lambda: torch.baddbmm(c, x, w, beta=p.beta, alpha=p.alpha)
            return lambda: torch.bmm(x, w)
        if bias is not None:
            return lambda: torch.addmm(bias, x, w)
        if p.beta:
            c = view(s["c"], p.n, p.m, p.ldc, "N", 0)
            return lambda: torch.addmm(c, x, w, beta=p.beta, alpha=p.alpha)
        return lambda: torch.mm(x, w)

    @staticmethod
    def _lt_output(p: GemmProblem, flat: torch.Tensor) -> torch.Tensor:
        size, stride = (p.n, p.m), (p.ldd, 1)
        if p.batch_count > 1:
            size, stride = (p.batch_count,) + size, (p.stride_d,) + stride
        return flat.as_strided(size, stride)

    def _rel_err(self, x: torch.Tensor, ref: torch.Tensor) -> float:
        return rel_err(x, ref, self.rel_err_chunk_elems)

    def _time(self, fn, nsets: int, iters: int | None = None, warmup: int | None = None) -> float:
        iters = iters or self.iters
        for i in range(self.warmup if warmup is None else warmup):
            fn(i % nsets)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        if self.spin_cycles_per_iter and hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(self.spin_cycles_per_iter * iters)
        for i in range(iters):
            starts[i].record()
            fn((i + 1) % nsets)
            ends[i].record()
        ends[-1].synchronize()
        return 1e3 * statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))

    def _candidates(self, p, descs, heuristic: list[Algo]):
        """Heuristic list, then variations of its leaders alternating with enumerated algorithms; each
        deduplicated by configuration and (beyond the heuristic list) validated with AlgoCheck."""
        lt, h = self.lt, self.handle
        seen: set = set()
        checks = 0

        def admit(algo: Algo, source: str):
            nonlocal checks
            try:
                cfg = lt.get_config(algo)
            except LtError:
                return None
            ident = tuple(cfg[c] for c in CUBLASLT_ALGO_COLUMNS)
            if ident in seen:
                return None
            seen.add(ident)
            if source != "heuristic":
                checks += 1
                ws = lt.algo_check(h, descs, algo)
                if ws is None or ws > self.ws_bytes:
                    return None
                if any(lt.cap_int(algo, f"MIN_ALIGNMENT_{x}_BYTES", 0) > ALIGNMENT for x in "ABCD"):
                    return None
            return _Candidate(algo, cfg, source)

        def build(algo_id: int, cfg: dict):
            algo = lt.algo_init(h, p, algo_id)
            if algo is None:
                return None
            try:
                lt.set_config(algo, cfg)
            except LtError:  # a value this algorithm does not take
                return None
            return algo

        def variants():
            # the heuristic's leaders with other split-k (one reduction scheme each) and the other CTA swizzle
            for base in heuristic[:3]:
                cfg = lt.get_config(base)
                changes = []
                if lt.cap_int(base, "CTA_SWIZZLING_SUPPORT"):
                    changes.append({"cta_swizzling": 1 - min(cfg["cta_swizzling"], 1)})
                if lt.cap_int(base, "SPLITK_SUPPORT"):
                    mask = lt.cap_int(base, "REDUCTION_SCHEME_MASK")
                    red = next((r for r in (2, 1, 4) if mask & r), 0)
                    changes += [{"splitk_num": sk, "reduction_scheme": red if sk > 1 else 0}
                                for sk in SPLITK_LADDER]
                for ch in changes:
                    algo = build(cfg["algo_id"], {**cfg, **ch})
                    yield algo and admit(algo, "variant")

        def enumerated():
            # per algorithm id, its tile x stage combinations in a fixed shuffled order, taken round-robin
            # across ids so a bounded budget still sees every kernel family
            rng = random.Random(self.seed)
            streams = []
            for algo_id in lt.algo_ids(h, p):
                base = lt.algo_init(h, p, algo_id)
                if base is None:
                    continue
                combos = [(t, st) for t in (lt.cap_list(base, "TILE_IDS") or [0])
                          for st in (lt.cap_list(base, "STAGES_IDS") or [0])]
                rng.shuffle(combos)
                streams.append((algo_id, iter(combos)))
            while streams and checks < 40 * self.max_candidates:
                alive = []
                for algo_id, it in streams:
                    combo = next(it, None)
                    if combo is None:
                        continue
                    alive.append((algo_id, it))
                    algo = build(algo_id, {"tile_id": combo[0], "stages_id": combo[1]})
                    yield algo and admit(algo, "enumerated")
                streams = alive

        for algo in heuristic:
            c = admit(algo, "heuristic")
            if c:
                yield c
        # then alternate between local variations and the wider enumeration
        gens = [variants(), enumerated()]
        while gens:
            for g in list(gens):
                c = next(g, StopIteration)
                if c is StopIteration:
                    gens.remove(g)
                elif c:
                    yield c

    def _tune(self, p: GemmProblem, descs) -> TuneOutcome:
        lt = self.lt
        pref = lt.create_preference(self.ws_bytes, min_alignment=ALIGNMENT)
        try:
            heuristic = lt.heuristics(self.handle, descs, pref, 32)
        finally:
            lt.destroy_preference(pref)
        if not heuristic:
            return TuneOutcome(FAILED, detail="the heuristic returned no algorithm", device=self.device)
        sets = self._buffers(p)
        nsets = len(sets)
        run = self._lt_runner(p, descs, sets)
        tol = TOLERANCE[p.d_type]

        ref = torch.empty_like(sets[0]["d"])
        run(heuristic[0], 0, out=ref)
        ref_view = self._lt_output(p, ref)
        torch_call = self._torch_views(p, sets[0])
        if torch_call is not None:
            out = torch_call()
            err = self._rel_err(out, ref_view)
            del out  # as big as D: gone before `check` is allocated
            if not err <= tol:
                return TuneOutcome(FAILED, device=self.device,
                                   detail=f"default cuBLASLt output differs from torch's by {err:.3g}: layout mapping?")
            calls = [self._torch_views(p, s) for s in sets]
        check = torch.empty_like(sets[0]["d"])
        check_view = self._lt_output(p, check)

        timed: list[_Candidate] = []
        rejected = pruned = 0
        best_us = math.inf
        for cand in self._candidates(p, descs, heuristic):
            if len(timed) + rejected + pruned >= self.max_candidates:
                break
            try:
                run(cand.algo, 0, out=check)  # also its warm-up (a first call may load the kernel)
                err = self._rel_err(check_view, ref_view)
                if not err <= tol:
                    rejected += 1
                    continue
                fn = lambda i, a=cand.algo: run(a, i)  # noqa: E731
                estimate = self._time(fn, nsets, iters=QUICK_ITERS, warmup=0)
                if cand.algo is not heuristic[0] and should_prune(estimate, best_us, self.prune_factor):
                    pruned += 1
                    continue
                cand.iters, cand.warmup = timing_plan(estimate, self.iters, self.warmup, self.time_budget_s)
                cand.us = self._time(fn, nsets, iters=cand.iters, warmup=cand.warmup)
                timed.append(cand)
                best_us = min(best_us, cand.us)
            except LtError:
                rejected += 1
        del check, check_view, ref, ref_view  # the confirm rounds' torch calls reuse this memory
        if not timed:
            return TuneOutcome(FAILED, detail="no candidate ran", rejected=rejected, device=self.device)
        timed.sort(key=lambda c: c.us)
        # the library's own pick (heuristic[0]) is the reference; any heuristic entry if it failed to run
        default_cand = next((c for c in timed if c.algo is heuristic[0]),
                            next((c for c in timed if c.source == "heuristic"), timed[0]))

        # Confirm the leaders against the baselines in interleaved rounds: the minimum of many noisy medians
        # is biased low, and a speedup must survive a re-measurement.
        finalists = timed[: self.confirm_top]
        if all(c is not default_cand for c in finalists):
            finalists.append(default_cand)
        rounds: dict[int, list[float]] = {id(c): [] for c in finalists}
        torch_rounds: list[float] = []
        # each with its own timing plan; torch's call with the default algorithm's (about as fast)
        for _ in range(3):
            for c in finalists:
                rounds[id(c)].append(self._time(lambda i, a=c.algo: run(a, i), nsets, iters=c.iters,
                                                warmup=min(2, c.warmup)))
            if torch_call is not None:
                torch_rounds.append(self._time(lambda i: calls[i](), nsets, iters=default_cand.iters,
                                               warmup=min(2, default_cand.warmup)))
        for c in finalists:
            c.us = statistics.median(rounds[id(c)])
        best = min(finalists, key=lambda c: c.us)
        heuristic_us = default_cand.us
        default_us = statistics.median(torch_rounds) if torch_rounds else heuristic_us

        outcome = TuneOutcome(DEFAULT, default_us=default_us, tuned_us=default_us, candidates=len(timed),
                              rejected=rejected, device=self.device, git_version=self.git_version(),
                              detail=f"best: {best.source} algo {best.config['algo_id']} {best.us:.2f} us; "
                                     f"{pruned} pruned (>{self.prune_factor:g}x best)")
        if best.us <= default_us * (1.0 - self.min_gain):
            row = row_from_problem(p, us=best.us, solution_index=-1, arch=self.gpu_name, cus=self.sms,
                                   rotating_mb=self.rotating_mb)
            row.update({"library": "cublasLt", "library_version": self.lib_version, **best.config,
                        "default_us": f"{default_us:.4f}", "heuristic_us": f"{heuristic_us:.4f}"})
            outcome.status, outcome.tuned_us, outcome.row = TUNED, best.us, row
        return outcome


def make_cuda_tuner(device: int, **kwargs) -> CudaLtTuner:
    """Picklable factory for worker processes."""
    return CudaLtTuner(device, **kwargs)
