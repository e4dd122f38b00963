"""GEMM roofline over the Llama-3.1-8B projections, decode to prefill, with clocks, power and the zeros effect.

C = A W^T with A [M, K] and W [N, K] for the four projections of a Llama-3.1-8B layer (N x K: qkv_proj 6144 x 4096,
o_proj 4096 x 4096, gate_up_proj 28672 x 4096, down_proj 4096 x 14336) and M = 1 ... 16384 rows, in one run:
- bf16: cuBLAS (``torch.matmul``), rocjit ``skinny_gemm`` (M <= 32) and ``gemv`` (M = 1);
- FP8 e4m3 with a bf16 result: cuBLASLt (``torch._scaled_mm``) with tensorwise and with rowwise scales, rocjit
  ``skinny_gemm`` (M <= 32, per-tensor scales: the tensorwise recipe) and, when the package has it,
  ``gemm_fp8_blockwise`` (1x128 activation / 128x128 weight scales; reported beside the others, never as `ours`,
  since its recipe differs from the peers').
Each result is placed on a roofline whose three ceilings are measured at the start of the same run (copy bandwidth,
bf16 and FP8 tensorwise matmul at 8192^3): achieved TFLOP/s against operational intensity = 2MNK / (bytes of A + W
+ C, each moved once; scale vectors left out), and `% of roofline` = achieved / min(peak, bandwidth x intensity).
`floor_us` is the roofline's time for the row's dtype, so the table's SOL% is ours against the roofline.

The zeros effect: a few large cases rerun with all-random, 50% zeros, 90% zeros and all-zero inputs (A and W
alike); on a power-limited GPU the data changes the speed through the clock.

While each case runs, a background thread samples the SM clock and the board power (NVML through nvidia-ml-py,
or amdsmi on AMD; without either the columns are None and the result carries a note). After its timing each case
is held busy (replays of its timing graph: 0.5 s, 2 s in the zeros rows; --quick 0.1 / 0.5 s) and the samples of the
last 60% of that hold make the row's min / mean / max, since the board's power reading lags the load.
% of roofline can pass 100 on zero-rich data: the matmul ceilings are measured on random data.

Timing: CUDA-graph replays of the rotated calls at every M (50 replays up to M = 256, 10 beyond), so each row is
the GPU's time, never an implementation's host launch cost (events would time that wherever it outlasts the
kernel); one that cannot be captured is timed with events, with a note, and its row names the method per
implementation (`timing_by_impl`). Medians; weights rotated beyond L2; random inputs except in the zeros rows.
cuBLASLt FP8 with M not a multiple of 16 runs on A padded to 16 rows when it refuses the real M (the row says
`peer_padded_m`); FLOPs count the real M.
"""
from __future__ import annotations

import statistics
import threading
import time

from rocjit.bench import harness as H

# (name, N, K): C [M, N] = A [M, K] W[N, K]^T
LAYERS = (("qkv_proj", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up_proj", 28672, 4096),
          ("down_proj", 4096, 14336))
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
QUICK_ROWS = (1, 16, 256, 4096)
ZEROS_CASES = (("gate_up_proj", 8192), ("down_proj", 8192), ("o_proj", 16384))
QUICK_ZEROS_CASES = (("gate_up_proj", 4096),)
DATA = ("random", "sparse50", "sparse90", "zeros")
FULL_REPS_MAX_M = 256      # up to here each timing takes the sweep's reps (50 replays), beyond it a fifth
SETTLE = 0.4            # the part of each case's hold whose clock / power samples are left out
SKINNY_MAX_M = 32

BF16, FP8, FP8_BLOCK = "bfloat16", "float8_e4m3fn", "float8_e4m3fn_blockwise"
ELEM_BYTES = {BF16: (2, 2, 2), FP8: (1, 1, 2), FP8_BLOCK: (1, 1, 2)}       # A, W, C
PEAK_KEY = {BF16: "bf16_matmul_TFLOPs", FP8: "fp8_matmul_TFLOPs", FP8_BLOCK: "fp8_matmul_TFLOPs"}
# implementations: peers first (library GEMMs), then rocjit's; `ours` is the best rocjit one of the row's recipe
PEERS = ("torch_matmul", "cublaslt_fp8_tensorwise", "cublaslt_fp8_rowwise")
OURS = ("rocjit_skinny_gemm", "rocjit_gemv")
EXTRA_ROCJIT = ("rocjit_gemm_fp8_blockwise",)


# ----------------------------------------------------------------------------- shapes and arithmetic
def shapes(quick: bool = False) -> list[tuple[str, int, int, int]]:
    """(layer, M, N, K) for every sweep case, layer by layer, M ascending."""
    rows = QUICK_ROWS if quick else ROWS
    return [(name, M, N, K) for name, N, K in LAYERS for M in rows]


def zeros_cases(quick: bool = False) -> list[tuple[str, int, int, int]]:
    nk = {name: (N, K) for name, N, K in LAYERS}
    return [(name, M, *nk[name]) for name, M in (QUICK_ZEROS_CASES if quick else ZEROS_CASES)]


def flop(M: int, N: int, K: int) -> int:
    return 2 * M * N * K


def min_bytes(M: int, N: int, K: int, dtype: str) -> int:
    """A, W and C each moved once (the minimum traffic)."""
    ea, ew, ec = ELEM_BYTES[dtype]
    return M * K * ea + N * K * ew + M * N * ec


def intensity(M: int, N: int, K: int, dtype: str) -> float:
    """Operational intensity, FLOP per byte of the minimum traffic."""
    return flop(M, N, K) / min_bytes(M, N, K, dtype)


def roofline_tflops(oi: float, dtype: str, ceilings: dict) -> float | None:
    """The attainable TFLOP/s at intensity `oi`: min(matmul peak of the dtype, copy bandwidth x oi)."""
    bw, peak = ceilings.get("copy_GBps"), ceilings.get(PEAK_KEY[dtype])
    if not bw or not peak:
        return None
    return min(peak, bw * 1e9 * oi / 1e12)


def tflops(M: int, N: int, K: int, us: float | None) -> float | None:
    return None if not us else flop(M, N, K) / (us * 1e-6) / 1e12


def pct_of_roofline(achieved: float | None, roof: float | None) -> float | None:
    return None if not achieved or not roof else 100.0 * achieved / roof


def roofline_us(M: int, N: int, K: int, dtype: str, ceilings: dict) -> float | None:
    """The roofline's time for the case: max(bytes / bandwidth, FLOPs / peak), µs."""
    roof = roofline_tflops(intensity(M, N, K, dtype), dtype, ceilings)
    return None if not roof else flop(M, N, K) / (roof * 1e12) * 1e6


def _stats(xs) -> dict | None:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"min": min(xs), "mean": statistics.fmean(xs), "max": max(xs), "n": len(xs)}


def build_row(case: str, M: int, N: int, K: int, dtype: str, times: dict, ceilings: dict, *,
              samples: dict | None = None, data: str = "random", **extra) -> dict:
    """One result row: harness fields (ours_us = the fastest rocjit GEMM of the row's recipe, peers_us = the
    library GEMMs) plus, per implementation, TFLOP/s, % of roofline, SM clock and power (min / mean / max)."""
    times = {k: v for k, v in times.items() if v is not None}
    ours = {k: v for k, v in times.items() if k in OURS}
    ours_op = min(ours, key=ours.get) if ours else None
    oi = intensity(M, N, K, dtype)
    roof = roofline_tflops(oi, dtype, ceilings)
    samples = samples or {}
    row = {"case": case, "shape": [M, N, K], "dtype": dtype,
           "ours_us": ours[ours_op] if ours_op else None,
           "peers_us": {k: v for k, v in times.items() if not k.startswith("rocjit_")},
           "floor_us": roofline_us(M, N, K, dtype, ceilings),
           "ours_op": ours_op[len("rocjit_"):] if ours_op else None,
           "rocjit_us": {k[len("rocjit_"):]: v for k, v in times.items() if k.startswith("rocjit_")},
           "data": data, "flop": flop(M, N, K), "min_bytes": min_bytes(M, N, K, dtype), "intensity": oi,
           "roofline_TFLOPs": roof,
           "TFLOPs": {k: tflops(M, N, K, v) for k, v in times.items()},
           "pct_roofline": {k: pct_of_roofline(tflops(M, N, K, v), roof) for k, v in times.items()},
           "sm_clock_MHz": {k: (samples.get(k) or {}).get("sm_clock_MHz") for k in times},
           "power_W": {k: (samples.get(k) or {}).get("power_W") for k in times}}
    row.update(extra)
    return row


# ----------------------------------------------------------------------------- clocks and power
class _NullMonitor:
    name = None

    def __init__(self, note: str):
        self.note = note

    def read(self):
        return None, None

    def info(self) -> dict:
        return {}

    def close(self):
        pass


class _NvmlMonitor:
    """SM clock (MHz) and board power (W) of one GPU through pynvml (the nvidia-ml-py package)."""
    name = "nvml"

    def __init__(self, nvml, handle):
        self.nvml, self.h = nvml, handle
        self.instant = getattr(nvml, "NVML_FI_DEV_POWER_INSTANT", None)
        self.note = None
        if self.instant is not None and self._instant_mw() is None:
            self.instant = None
        self.note = ("power: instantaneous (NVML_FI_DEV_POWER_INSTANT)" if self.instant is not None else
                     "power: nvmlDeviceGetPowerUsage (may be averaged over up to 1 s on recent GPUs)")

    def _instant_mw(self):
        try:
            v = self.nvml.nvmlDeviceGetFieldValues(self.h, [self.instant])[0]
            return None if v.nvmlReturn != 0 else float(v.value.uiVal)
        except Exception:
            return None

    def read(self):
        n = self.nvml
        try:
            clk = float(n.nvmlDeviceGetClockInfo(self.h, n.NVML_CLOCK_SM))
        except Exception:
            clk = None
        mw = self._instant_mw() if self.instant is not None else None
        if mw is None:
            try:
                mw = float(n.nvmlDeviceGetPowerUsage(self.h))
            except Exception:
                mw = None
        return clk, None if mw is None else mw / 1000.0

    def info(self) -> dict:
        n, out = self.nvml, {"monitor": "nvml"}
        for key, f in (("power_limit_W", lambda: n.nvmlDeviceGetEnforcedPowerLimit(self.h) / 1000.0),
                       ("max_sm_clock_MHz", lambda: n.nvmlDeviceGetMaxClockInfo(self.h, n.NVML_CLOCK_SM))):
            try:
                out[key] = float(f())
            except Exception:
                out[key] = None
        return out

    def close(self):
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass


class _AmdSmiMonitor:
    """GFX clock (MHz) and socket power (W) through amdsmi (ROCm)."""
    name = "amdsmi"
    note = None

    def __init__(self, amdsmi, handle):
        self.a, self.h = amdsmi, handle

    def read(self):
        a = self.a
        try:
            c = a.amdsmi_get_clock_info(self.h, a.AmdSmiClkType.GFX)
            clk = float(c.get("clk", c.get("cur_clk")))
        except Exception:
            clk = None
        try:
            p = a.amdsmi_get_power_info(self.h)
            w = next(p[k] for k in ("current_socket_power", "average_socket_power", "socket_power")
                     if isinstance(p.get(k), (int, float)))
            pw = float(w)
        except Exception:
            pw = None
        return clk, pw

    def info(self) -> dict:
        out = {"monitor": "amdsmi"}
        try:
            out["power_limit_W"] = float(self.a.amdsmi_get_power_cap_info(self.h)["power_cap"]) / 1e6
        except Exception:
            out["power_limit_W"] = None
        return out

    def close(self):
        try:
            self.a.amdsmi_shut_down()
        except Exception:
            pass


def _torch_gpu():
    """(is_hip, uuid string or None, device index) of torch's current GPU; (False, None, 0) without one."""
    try:
        import torch
        if not torch.cuda.is_available():
            return False, None, 0
        d = torch.cuda.current_device()
        uuid = getattr(torch.cuda.get_device_properties(d), "uuid", None)
        return bool(torch.version.hip), None if uuid is None else str(uuid), d
    except Exception:
        return False, None, 0


def open_monitor(*, nvml=None, amdsmi=None, gpu=None):
    """The clock / power monitor of the GPU torch uses: NVML, or amdsmi on AMD, else a null monitor whose `note`
    says why (the library is absent, or it found no GPU). nvml / amdsmi / gpu replace the imports (tests)."""
    is_hip, uuid, index = gpu if gpu is not None else _torch_gpu()
    notes = []
    order = ("amdsmi", "nvml") if is_hip else ("nvml", "amdsmi")
    for which in order:
        try:
            if which == "nvml":
                n = nvml
                if n is None:
                    import pynvml as n
                n.nvmlInit()
                h = None
                if uuid:
                    for u in (uuid if uuid.startswith("GPU-") else "GPU-" + uuid, uuid):
                        try:
                            h = n.nvmlDeviceGetHandleByUUID(u)
                            break
                        except Exception:
                            pass
                return _NvmlMonitor(n, h if h is not None else n.nvmlDeviceGetHandleByIndex(index))
            a = amdsmi
            if a is None:
                import amdsmi as a
            a.amdsmi_init()
            return _AmdSmiMonitor(a, a.amdsmi_get_processor_handles()[index])
        except ImportError:
            notes.append({"nvml": "nvidia-ml-py (pynvml) is not installed (pip install nvidia-ml-py, or the "
                                  "package's `bench` extra)",
                          "amdsmi": "amdsmi is not importable"}[which])
        except Exception as e:
            notes.append(f"{which}: {type(e).__name__}: {e}")
    return _NullMonitor("no clock / power samples: " + "; ".join(notes))


class Sampler:
    """Samples a monitor's (clock, power) every `interval_s` on a background thread while the `with` block runs;
    `stats()` gives min / mean / max of each (None where the monitor reads nothing) over the samples taken at
    least `skip_s` after the start (the board's power reading lags the load; all samples if none is that late)."""

    def __init__(self, monitor, interval_s: float = 0.005, skip_s: float = 0.0):
        self.monitor, self.interval_s, self.skip_s = monitor, interval_s, skip_s
        self.samples: list[tuple] = []                 # (seconds since the start, clock, power)
        self._stop = threading.Event()
        self._thread = None
        self._t0 = 0.0

    def _take(self):
        self.samples.append((time.perf_counter() - self._t0, *self.monitor.read()))

    def _loop(self):
        while True:
            self._take()
            if self._stop.wait(self.interval_s):
                break

    def __enter__(self):
        self.samples, self._stop, self._t0 = [], threading.Event(), time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="rocjit-roofline-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._take()
        return False

    def stats(self) -> dict:
        late = [s for s in self.samples if s[0] >= self.skip_s] or self.samples
        return {"sm_clock_MHz": _stats(c for _, c, _ in late), "power_W": _stats(p for _, _, p in late)}


# ----------------------------------------------------------------------------- the GPU side
def _blockwise_adapter(fn, torch, ops, a_bf16, w_bf16):
    """A zero-argument call of rocjit.ops.gemm_fp8_blockwise (forward NT, 1x128 / 128x128 scales) on these
    operands (it raises when the op refuses them: the caller notes and skips). The only place that knows that
    op's signature: keep it tiny."""
    qa, sa, _, _ = ops.quantize_fp8_dual(a_bf16)          # 1 x 128 scales M-major, as a training step has them
    qw, sw = ops.quantize_fp8_weight(w_bf16)
    call = lambda: fn(qa, sa, qw, sw, out_dtype=torch.bfloat16)  # noqa: E731
    call()
    return call


def _make(torch, kind: str, shape, dtype, *, gen, scale: float = 1.0):
    """Random normal data (x scale) with a fraction of exact zeros: kind random / sparse50 / sparse90 / zeros."""
    if kind == "zeros":
        return torch.zeros(shape, device="cuda", dtype=dtype)
    x = torch.randn(shape, device="cuda", generator=gen) * scale
    if kind.startswith("sparse"):
        x *= torch.rand(shape, device="cuda", generator=gen) >= int(kind[len("sparse"):]) / 100.0
    return x.to(dtype)


class _Run:
    def __init__(self, torch, result, monitor, quick):
        import rocjit.ops as ops
        self.torch, self.ops, self.result, self.monitor, self.quick = torch, ops, result, monitor, quick
        self.hold_s = 0.1 if quick else 0.5
        self.reps = 20 if quick else 50
        self.gen = torch.Generator(device="cuda")
        self.gen.manual_seed(0)
        self.blockwise = getattr(ops, "gemm_fp8_blockwise", None)
        self.blockwise_note = None if self.blockwise else "rocjit.ops.gemm_fp8_blockwise is not in this build: skipped"
        self.pad_cache: dict = {}

    def note(self, text):
        if text not in self.result["notes"]:
            self.result["notes"].append(text)
            print(text, flush=True)

    def _hold(self, fns, seconds, graph=None):
        """Keep the GPU on this case for `seconds`: replays of its timing graph (the work as timed, no host gap) or,
        without one, back-to-back launches; synchronized every few replays / calls."""
        torch = self.torch
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            if graph is not None:
                for _ in range(4):
                    graph.replay()
            else:
                for _ in range(max(1, 32 // len(fns))):
                    for f in fns:
                        f()
            torch.cuda.synchronize()

    def measure(self, fns, M, hold_s=None, name="?"):
        """(median µs, clock / power stats, "graph" or "events") of the rotated callables: timed first (graph
        replays; events, with a note, where the capture fails), then held busy for hold_s while the sampler runs; its
        statistics leave out the first SETTLE of the hold (the readings lag the load)."""
        fns = list(fns)
        reps = self.reps if M <= FULL_REPS_MAX_M else max(5, self.reps // 5)
        graphs: list = []
        us, how = H.time_graph_or_events(fns, reps=reps, keep=graphs, note=lambda t: self.note(f"{name} at M={M}: {t}"))
        hold = self.hold_s if hold_s is None else hold_s
        with Sampler(self.monitor, skip_s=SETTLE * hold) as s:
            self._hold(fns, hold, graphs[0] if graphs else None)
        return us, s.stats(), how

    def _scaled_mm_a(self, a8, M):
        """A as cuBLASLt takes it: the real rows, or padded to a multiple of 16 where it refuses them."""
        torch = self.torch
        if M % 16 == 0:
            return a8, M
        if M not in self.pad_cache:
            w = torch.zeros(32, a8.shape[1], device="cuda").to(a8.dtype)
            try:
                torch._scaled_mm(a8, w.t(), torch.ones((), device="cuda"), torch.ones((), device="cuda"),
                                 out_dtype=torch.bfloat16)
                self.pad_cache[M] = False
            except RuntimeError:
                self.pad_cache[M] = True
        if not self.pad_cache[M]:
            return a8, M
        Mp = -(-M // 16) * 16
        ap = torch.zeros(Mp, a8.shape[1], device="cuda").to(a8.dtype)
        ap[:M] = a8
        return ap, Mp

    def case(self, case, M, N, K, wsets, a_bf16, *, data="random", hold_s=None, rocjit=True):
        """Rows (bf16, FP8 and blockwise FP8) of one (M, N, K) on the weight sets given (bf16 and fp8 each)."""
        torch, ops = self.torch, self.ops
        f8 = torch.float8_e4m3fn
        ws16, ws8 = wsets
        c16 = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        rows, t, smp, how = [], {}, {}, {}

        def go(name, fns):
            try:
                t[name], smp[name], how[name] = self.measure(fns, M, hold_s, name)
            except Exception as e:  # a failing implementation is a note, not a lost run
                self.note(f"{name} failed at {case} M={M} N={N} K={K}: {type(e).__name__}: {e}")

        go("torch_matmul", [lambda w=w: torch.matmul(a_bf16, w.t(), out=c16) for w in ws16])
        if rocjit and M == 1:
            x = a_bf16[0]
            go("rocjit_gemv", [lambda w=w: ops.gemv(w, x) for w in ws16])
        if rocjit and M <= SKINNY_MAX_M:
            go("rocjit_skinny_gemm", [lambda w=w: ops.skinny_gemm(a_bf16, w) for w in ws16])
        rows.append(self.row(case, M, N, K, BF16, t, smp, how, data=data))

        t, smp = {}, {}
        a8 = a_bf16.to(f8)
        one = torch.ones((), device="cuda")
        ap, Mp = self._scaled_mm_a(a8, M)
        sa_row = torch.rand(Mp, 1, device="cuda", generator=self.gen) + 0.5
        sw_row = torch.rand(1, N, device="cuda", generator=self.gen) + 0.5
        go("cublaslt_fp8_tensorwise", [lambda w=w: torch._scaled_mm(ap, w.t(), one, one, out_dtype=torch.bfloat16)
                                       for w in ws8])
        go("cublaslt_fp8_rowwise", [lambda w=w: torch._scaled_mm(ap, w.t(), sa_row, sw_row, out_dtype=torch.bfloat16)
                                    for w in ws8])
        if rocjit and M <= SKINNY_MAX_M:
            sa, sw = torch.tensor([0.5], device="cuda"), torch.tensor([0.7], device="cuda")
            go("rocjit_skinny_gemm", [lambda w=w: ops.skinny_gemm(a8, w, scale_a=sa, scale_w=sw) for w in ws8])
        rows.append(self.row(case, M, N, K, FP8, t, smp, how, data=data,
                             **({"peer_padded_m": Mp} if Mp != M else {})))

        if rocjit and self.blockwise is not None:
            t, smp = {}, {}
            try:
                fns = [_blockwise_adapter(self.blockwise, torch, ops, a_bf16, w) for w in ws16]
            except Exception as e:
                fns = None
                self.note(f"gemm_fp8_blockwise skipped at {case} M={M} N={N} K={K}: {type(e).__name__}: {e}")
            if fns:
                go("rocjit_gemm_fp8_blockwise", fns)
                rows.append(self.row(case, M, N, K, FP8_BLOCK, t, smp, how, data=data))
        return rows

    def row(self, case, M, N, K, dtype, t, smp, how, **extra):
        kinds = {how[k] for k in t if k in how}
        if len(kinds) > 1 or kinds == {"events"}:
            extra["timing_by_impl"] = {k: how[k] for k in t if k in how}
        row = build_row(case, M, N, K, dtype, t, self.result["ceilings"], samples=smp,
                        timing=kinds.pop() if len(kinds) == 1 else "mixed" if kinds else "graph", **extra)
        H.add_row(self.result, **{k: row.pop(k) for k in ("case", "shape", "dtype", "ours_us", "peers_us")},
                  floor=row.pop("floor_us"), **row)
        r = self.result["rows"][-1]
        print(f"{r['case']:>22s} {'x'.join(map(str, r['shape'])):>17s} {r['dtype']:<24s} {r['data']:<8s} " +
              "  ".join(f"{k}={v:.1f}us/{H._f(r['pct_roofline'][k], 0)}%" for k, v in
                        {**r['peers_us'], **{'rocjit_' + a: b for a, b in r['rocjit_us'].items()}}.items()),
              flush=True)
        return r


def _weights(torch, N, K, kind, gen, count):
    ws16 = [_make(torch, kind, (N, K), torch.bfloat16, gen=gen) for _ in range(count)]
    ws8 = [w.to(torch.float8_e4m3fn) for w in ws16]
    return ws16, ws8


def run(argv) -> dict:
    import torch
    quick = H.quick(argv)
    monitor = open_monitor()
    try:
        result = H.new_result("roofline", H.measure_ceilings(matmul=True, fp8=True))
        result["notes"] = [n for n in (monitor.note,) if n]
        result["monitor"] = monitor.info()
        R = _Run(torch, result, monitor, quick)
        if R.blockwise_note:
            R.note(R.blockwise_note)
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        # the sweep: weights per layer rotated beyond L2, one random A per M
        for name, N, K in LAYERS:
            ms = [M for layer, M, _, _ in shapes(quick) if layer == name]
            wsets = _weights(torch, N, K, "random", R.gen, H.rotation_count(2 * N * K, l2_bytes=l2))
            for M in ms:
                a = _make(torch, "random", (M, K), torch.bfloat16, gen=R.gen)
                R.case(name, M, N, K, wsets, a)
                del a
            del wsets
            torch.cuda.empty_cache()
        # the zeros effect: the same case on random / sparse / all-zero A and W, held longer (clock and power settle)
        for name, M, N, K in zeros_cases(quick):
            for kind in DATA:
                wsets = _weights(torch, N, K, kind, R.gen, 2)
                a = _make(torch, kind, (M, K), torch.bfloat16, gen=R.gen)
                R.case(f"zeros_{name}", M, N, K, wsets, a, data=kind, hold_s=0.5 if quick else 2.0, rocjit=False)
                del wsets, a
                torch.cuda.empty_cache()
    finally:
        monitor.close()
    return result


# ----------------------------------------------------------------------------- table and plot
LABELS = {
    "torch_matmul": ("cuBLAS bf16 (torch.matmul)", "tab:blue", "o"),
    "cublaslt_fp8_tensorwise": ("cuBLASLt FP8 tensorwise (_scaled_mm)", "tab:orange", "s"),
    "cublaslt_fp8_rowwise": ("cuBLASLt FP8 rowwise (_scaled_mm)", "tab:brown", "D"),
    ("rocjit_skinny_gemm", BF16): ("rocjit skinny_gemm bf16", "tab:green", "^"),
    ("rocjit_skinny_gemm", FP8): ("rocjit skinny_gemm FP8", "tab:red", "v"),
    "rocjit_gemv": ("rocjit gemv bf16", "tab:purple", "*"),
    "rocjit_gemm_fp8_blockwise": ("rocjit gemm_fp8_blockwise", "tab:pink", "X"),
}


def _series_key(impl, dtype):
    return (impl, dtype) if (impl, dtype) in LABELS else impl


def series(result: dict, *, data: str = "random", sweep_only: bool = True) -> dict:
    """{series key: [(row, impl name)]} over the rows with this data kind (the zeros rows are left out)."""
    out: dict = {}
    for r in result["rows"]:
        if r.get("data", "random") != data or (sweep_only and r["case"].startswith("zeros_")):
            continue
        for impl in r.get("TFLOPs", {}):
            if r["TFLOPs"][impl]:
                out.setdefault(_series_key(impl, r["dtype"]), []).append((r, impl))
    return out


def _mean(stat):
    return None if not stat else stat["mean"]


def format_table(result: dict) -> str:
    """One line per (row, implementation): µs, TFLOP/s, % of roofline, SM clock and power (mean, min-max)."""
    c = result.get("ceilings", {})
    lines = [f"ceilings: copy {c.get('copy_GBps', 0):.0f} GB/s, bf16 {c.get('bf16_matmul_TFLOPs', 0):.0f} TFLOP/s, "
             f"fp8 {c.get('fp8_matmul_TFLOPs', 0):.0f} TFLOP/s (8192^3)"]
    lines += [f"note: {n}" for n in result.get("notes", [])]
    lines.append(" | ".join(("case", "M x N x K", "dtype", "data", "impl", "us", "TFLOP/s", "FLOP/B", "%roof",
                             "SM MHz mean (min-max)", "W mean (min-max)")))

    def rng(s, nd=0):
        return "-" if not s else f"{s['mean']:.{nd}f} ({s['min']:.{nd}f}-{s['max']:.{nd}f})"
    for r in result["rows"]:
        us = {**r["peers_us"], **{"rocjit_" + k: v for k, v in r.get("rocjit_us", {}).items()}}
        for impl, t in us.items():
            lines.append(" | ".join((r["case"], "x".join(map(str, r["shape"])), r["dtype"], r.get("data", "-"), impl,
                                     H._f(t), H._f(r["TFLOPs"].get(impl), 1), H._f(r.get("intensity"), 1),
                                     H._f(r["pct_roofline"].get(impl), 1),
                                     rng((r.get("sm_clock_MHz") or {}).get(impl)),
                                     rng((r.get("power_W") or {}).get(impl)))))
    return "\n".join(lines)


def _short(impl: str) -> str:
    """A two-line tick label of an implementation: its legend label without the parenthesis, split after the
    library."""
    words = LABELS.get(impl, (impl,))[0].split(" (")[0].split(" ", 1)
    return "\n".join(words)


def plot(result: dict, path: str) -> None:
    """Four panels: the roofline (log-log, measured ceilings, one marker per library / rocjit GEMM), % of roofline
    against M, the zeros effect (TFLOP/s, SM clock and power per data kind), and clock / power across the sweep."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    c = result.get("ceilings", {})
    fig, axes = plt.subplots(2, 2, figsize=(16, 12))
    ax_roof, ax_pct, ax_zero, ax_pow = axes.flat
    sweep = series(result)

    # roofline
    ois = [r["intensity"] for pts in sweep.values() for r, _ in pts] or [1.0, 1e4]
    lo, hi = min(ois) / 2, max(ois) * 2
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for dt, ls in ((BF16, "-"), (FP8, "--")):
        if roofline_tflops(1.0, dt, c) is not None:
            ax_roof.plot(xs, [roofline_tflops(x, dt, c) for x in xs], ls, color="black", lw=1.5,
                         label=f"roofline {'bf16' if dt == BF16 else 'FP8'}: {c[PEAK_KEY[dt]]:.0f} TFLOP/s, "
                               f"{c['copy_GBps'] / 1e3:.2f} TB/s")
            ridge = c[PEAK_KEY[dt]] * 1e12 / (c["copy_GBps"] * 1e9)
            ax_roof.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, c[PEAK_KEY[dt]]), textcoords="offset points",
                             xytext=(5, 6), fontsize=8)
    for key, pts in sorted(sweep.items(), key=lambda kv: list(LABELS).index(kv[0]) if kv[0] in LABELS else 99):
        label, color, marker = LABELS.get(key, (str(key), None, "."))
        ax_roof.scatter([r["intensity"] for r, _ in pts], [r["TFLOPs"][i] for r, i in pts], marker=marker,
                        color=color, s=36, alpha=0.8, label=label, edgecolors="none")
        best = max(pts, key=lambda p: p[0]["pct_roofline"][p[1]] or 0)
        ax_roof.annotate(f"{best[0]['pct_roofline'][best[1]]:.0f}%", (best[0]["intensity"], best[0]["TFLOPs"][best[1]]),
                         textcoords="offset points", xytext=(4, -10), fontsize=7, color=color)
    ax_roof.set_xscale("log")
    ax_roof.set_yscale("log")
    ax_roof.set_xlabel("operational intensity (FLOP / byte of A + W + C)")
    ax_roof.set_ylabel("achieved TFLOP/s")
    ax_roof.set_title("Llama-3.1-8B GEMMs (qkv, o, gate_up, down), M = 1 ... 16384, on the measured roofline\n"
                      "(labels: best % of roofline per series)", fontsize=10)
    ax_roof.grid(alpha=0.3, which="both")
    ax_roof.legend(fontsize=7, loc="lower right")

    # % of roofline against M: each point one layer, the line the median over layers
    for key, pts in sweep.items():
        label, color, marker = LABELS.get(key, (str(key), None, "."))
        ax_pct.scatter([r["shape"][0] for r, _ in pts], [r["pct_roofline"][i] for r, i in pts], marker=marker,
                       color=color, s=22, alpha=0.45, edgecolors="none")
        by_m: dict = {}
        for r, i in pts:
            by_m.setdefault(r["shape"][0], []).append(r["pct_roofline"][i])
        ms = sorted(by_m)
        ax_pct.plot(ms, [statistics.median(by_m[m]) for m in ms], "-", marker=marker, color=color, label=label,
                    lw=1.5, ms=5)
    ax_pct.axhline(100, color="black", lw=0.8, ls=":")
    ax_pct.set_xscale("log", base=2)
    ax_pct.set_xlabel("M (tokens)")
    ax_pct.set_ylabel("% of roofline")
    ax_pct.set_title("% of roofline (points: layers; line: median over the four layers)", fontsize=10)
    ax_pct.grid(alpha=0.3)
    ax_pct.legend(fontsize=7)

    # zeros effect: TFLOP/s per data kind, clock and power written on the bars
    zrows = [r for r in result["rows"] if r["case"].startswith("zeros_")]
    groups: dict = {}
    for r in zrows:
        for impl, v in r["TFLOPs"].items():
            if v:
                groups.setdefault((r["case"][len("zeros_"):], tuple(r["shape"]), impl), {})[r.get("data")] = (r, impl)
    if groups:
        kinds = [k for k in DATA if any(k in g for g in groups.values())]
        width = 0.8 / max(1, len(kinds))
        colors = dict(zip(DATA, ("tab:gray", "tab:cyan", "tab:olive", "tab:green")))
        for gi, (gk, g) in enumerate(groups.items()):
            for ki, kind in enumerate(kinds):
                if kind not in g:
                    continue
                r, impl = g[kind]
                v = r["TFLOPs"][impl]
                x = gi + (ki - (len(kinds) - 1) / 2) * width
                ax_zero.bar(x, v, width, color=colors[kind], label=kind if gi == 0 else None)
                clk, pw = _mean((r.get("sm_clock_MHz") or {}).get(impl)), _mean((r.get("power_W") or {}).get(impl))
                # above the bar its TFLOP/s and % of roofline, inside it the mean clock and power (vertical text: a
                # group's four bars are narrow)
                ax_zero.annotate(f"{v:.0f} ({r['pct_roofline'][impl]:.0f}%)", (x, v), textcoords="offset points",
                                 xytext=(0, 2), ha="center", va="bottom", rotation=90, fontsize=6)
                inside = " ".join(t for t in (f"{clk:.0f} MHz" if clk is not None else None,
                                              f"{pw:.0f} W" if pw is not None else None) if t)
                if inside:
                    ax_zero.text(x, v * 0.04, inside, ha="center", va="bottom", rotation=90, fontsize=6,
                                 color="white")
        ax_zero.set_xticks(range(len(groups)))
        ax_zero.set_xticklabels([f"{n.replace('_proj', '')}\nM={s[0]}\n{_short(i)}" for n, s, i in groups],
                                fontsize=6)
        ax_zero.set_ylabel("TFLOP/s")
        ax_zero.set_title("the zeros effect: random vs 50% / 90% zeros vs all zeros (A and W)\n"
                          "(above a bar: TFLOP/s (% of roofline); in it: mean SM clock, mean power)", fontsize=10)
        ax_zero.legend(fontsize=8)
        ax_zero.margins(y=0.25)
    else:
        ax_zero.text(0.5, 0.5, "no zeros-effect rows", ha="center", va="center", transform=ax_zero.transAxes)
    ax_zero.grid(alpha=0.3, axis="y")

    # clocks and power across the sweep (library GEMMs)
    ax_w = ax_pow.twinx()
    have = False
    mon = result.get("monitor", {})
    for key in ("torch_matmul", "cublaslt_fp8_tensorwise"):
        label, color, marker = LABELS[key]
        pts = [(r["intensity"], _mean(r["sm_clock_MHz"].get(i)), _mean(r["power_W"].get(i)))
               for r, i in sweep.get(key, [])]
        pc = [(x, y) for x, y, _ in pts if y is not None]
        pp = [(x, y) for x, _, y in pts if y is not None]
        if pc:
            ax_pow.scatter(*zip(*pc), marker=marker, color=color, s=20, label=f"SM clock, {label}")
            have = True
        if pp:
            ax_w.scatter(*zip(*pp), marker=marker, facecolors="none", edgecolors=color, s=28,
                         label=f"power, {label}")
            have = True
    if mon.get("power_limit_W"):
        ax_w.axhline(mon["power_limit_W"], color="red", ls=":", lw=1, label=f"power limit {mon['power_limit_W']:.0f} W")
    if mon.get("max_sm_clock_MHz"):
        ax_pow.axhline(mon["max_sm_clock_MHz"], color="gray", ls=":", lw=1,
                       label=f"max SM clock {mon['max_sm_clock_MHz']:.0f} MHz")
    ax_pow.set_xscale("log")
    ax_pow.set_xlabel("operational intensity (FLOP / byte)")
    ax_pow.set_ylabel("SM clock, MHz (filled)")
    ax_w.set_ylabel("board power, W (hollow)")
    ax_pow.set_title("SM clock and power during each case (mean of the samples)", fontsize=10)
    if have:
        h1, l1 = ax_pow.get_legend_handles_labels()
        h2, l2 = ax_w.get_legend_handles_labels()
        ax_pow.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower left")
    else:
        ax_pow.text(0.5, 0.5, "no clock / power samples\n" + "\n".join(result.get("notes", []))[:300],
                    ha="center", va="center", transform=ax_pow.transAxes, fontsize=8, wrap=True)
    ax_pow.grid(alpha=0.3)

    fig.suptitle(f"rocjit roofline — {result['gpu']} — {result['commit']} — {result['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["LAYERS", "ROWS", "QUICK_ROWS", "shapes", "zeros_cases", "flop", "min_bytes", "intensity",
           "roofline_tflops", "roofline_us", "tflops", "pct_of_roofline", "build_row", "open_monitor", "Sampler",
           "run", "format_table", "plot", "series"]
