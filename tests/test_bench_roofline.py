"""The roofline suite's pure logic without a GPU: shapes, intensity and roofline arithmetic, rows, the clock /
power sampler (with fake NVML / amdsmi modules), the table and the plot of a synthetic result."""
import builtins
import json
import time
import types

import pytest

from rocjit.bench import harness
from rocjit.bench import roofline as R

CEIL = {"copy_GBps": 3000.0, "bf16_matmul_TFLOPs": 750.0, "fp8_matmul_TFLOPs": 1300.0}


def test_shapes_cover_decode_to_prefill():
    full = R.shapes()
    assert len(full) == 4 * 15
    assert {(n, k) for _, _, n, k in full} == {(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)}
    assert sorted({m for _, m, _, _ in full}) == [2 ** i for i in range(15)]
    quick = R.shapes(quick=True)
    assert set(quick) < set(full) and {m for _, m, _, _ in quick} >= {1, 4096}
    assert {layer for layer, *_ in quick} == {name for name, *_ in R.LAYERS}
    for name, M, N, K in R.zeros_cases() + R.zeros_cases(quick=True):
        assert (name, N, K) in R.LAYERS and M >= 4096


def test_intensity_is_flops_over_a_w_c_once():
    M, N, K = 3, 5, 7
    assert R.flop(M, N, K) == 2 * 3 * 5 * 7
    assert R.min_bytes(M, N, K, R.BF16) == (3 * 7 + 5 * 7 + 3 * 5) * 2
    assert R.min_bytes(M, N, K, R.FP8) == 3 * 7 + 5 * 7 + 3 * 5 * 2
    assert R.intensity(M, N, K, R.BF16) == pytest.approx(210 / 142)
    # square bf16: 2n^3 / 6n^2 = n / 3
    assert R.intensity(8192, 8192, 8192, R.BF16) == pytest.approx(8192 / 3)
    # decode: about one FLOP per byte of bf16 weight
    assert R.intensity(1, 4096, 4096, R.BF16) == pytest.approx(1.0, rel=1e-3)


def test_roofline_is_min_of_bandwidth_and_peak():
    # memory side: 3 TB/s x 10 FLOP/B = 30 TFLOP/s
    assert R.roofline_tflops(10.0, R.BF16, CEIL) == pytest.approx(30.0)
    assert R.roofline_tflops(1e5, R.BF16, CEIL) == 750.0
    assert R.roofline_tflops(1e5, R.FP8, CEIL) == 1300.0
    assert R.roofline_tflops(1e5, R.FP8_BLOCK, CEIL) == 1300.0
    assert R.roofline_tflops(10.0, R.BF16, {"copy_GBps": 3000.0}) is None
    # the roofline time is the larger of the two floors
    M, N, K = 1, 4096, 4096
    assert R.roofline_us(M, N, K, R.BF16, CEIL) == pytest.approx(R.min_bytes(M, N, K, R.BF16) / 3000e9 * 1e6)
    M = N = K = 8192
    assert R.roofline_us(M, N, K, R.BF16, CEIL) == pytest.approx(2 * 8192 ** 3 / 750e12 * 1e6)
    assert R.tflops(M, N, K, 1e6) == pytest.approx(2 * 8192 ** 3 / 1e12)
    assert R.pct_of_roofline(375.0, 750.0) == 50.0
    assert R.pct_of_roofline(None, 750.0) is None and R.tflops(M, N, K, None) is None


def test_build_row_fields_and_ours():
    M, N, K = 1, 4096, 4096
    floor = R.roofline_us(M, N, K, R.BF16, CEIL)
    times = {"torch_matmul": 2 * floor, "rocjit_skinny_gemm": 1.25 * floor, "rocjit_gemv": 1.1 * floor,
             "rocjit_gemm_fp8_blockwise": None}
    samples = {"torch_matmul": {"sm_clock_MHz": {"min": 1700.0, "mean": 1750.0, "max": 1980.0, "n": 9},
                                "power_W": {"min": 300.0, "mean": 400.0, "max": 500.0, "n": 9}}}
    row = R.build_row("o_proj", M, N, K, R.BF16, times, CEIL, samples=samples, timing="graph")
    assert row["ours_op"] == "gemv" and row["ours_us"] == times["rocjit_gemv"]
    assert row["peers_us"] == {"torch_matmul": times["torch_matmul"]}
    assert row["rocjit_us"] == {"skinny_gemm": times["rocjit_skinny_gemm"], "gemv": times["rocjit_gemv"]}
    assert row["floor_us"] == pytest.approx(floor)
    assert row["pct_roofline"]["torch_matmul"] == pytest.approx(50.0)
    assert row["pct_roofline"]["rocjit_gemv"] == pytest.approx(100 / 1.1)
    assert row["sm_clock_MHz"]["torch_matmul"]["mean"] == 1750.0 and row["power_W"]["rocjit_gemv"] is None
    assert row["data"] == "random" and row["timing"] == "graph"
    json.dumps(row)
    # the blockwise GEMM is reported but never taken as `ours` (another recipe than the peers')
    row = R.build_row("o_proj", 4096, N, K, R.FP8_BLOCK, {"rocjit_gemm_fp8_blockwise": 100.0}, CEIL)
    assert row["ours_us"] is None and row["rocjit_us"] == {"gemm_fp8_blockwise": 100.0}
    assert row["TFLOPs"]["rocjit_gemm_fp8_blockwise"] == pytest.approx(2 * 4096 ** 3 / 100e-6 / 1e12)


# ----------------------------------------------------------------------------- the sampler
class FakeNvml(types.SimpleNamespace):
    NVML_CLOCK_SM = 1
    NVML_FI_DEV_POWER_INSTANT = 186

    def __init__(self, *, fail_init=False, instant=True):
        super().__init__(calls=[], fail_init=fail_init, instant=instant, t=0)

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByUUID(self, u):
        assert u.startswith("GPU-")
        self.calls.append(("uuid", u))
        return "h0"

    def nvmlDeviceGetHandleByIndex(self, i):
        self.calls.append(("index", i))
        return f"h{i}"

    def nvmlDeviceGetClockInfo(self, h, which):
        self.t += 1
        return 1500 + 100 * (self.t % 3)                     # 1600, 1700, 1500, ...

    def nvmlDeviceGetFieldValues(self, h, ids):
        v = types.SimpleNamespace(nvmlReturn=0 if self.instant else 3, value=types.SimpleNamespace(uiVal=650000))
        return [v]

    def nvmlDeviceGetPowerUsage(self, h):
        return 400000

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700000

    def nvmlDeviceGetMaxClockInfo(self, h, which):
        return 1980


def test_sampler_with_fake_nvml():
    nv = FakeNvml()
    mon = R.open_monitor(nvml=nv, gpu=(False, "8b2f0c3e-0000", 0))
    assert mon.name == "nvml" and ("uuid", "GPU-8b2f0c3e-0000") in nv.calls
    assert "instantaneous" in mon.note
    assert mon.info() == {"monitor": "nvml", "power_limit_W": 700.0, "max_sm_clock_MHz": 1980.0}
    with R.Sampler(mon, interval_s=0.001) as s:
        time.sleep(0.03)
    st = s.stats()
    assert st["sm_clock_MHz"]["n"] >= 3
    assert st["sm_clock_MHz"]["min"] == 1500.0 and st["sm_clock_MHz"]["max"] == 1700.0
    assert 1500.0 <= st["sm_clock_MHz"]["mean"] <= 1700.0
    assert st["power_W"] == {"min": 650.0, "mean": 650.0, "max": 650.0, "n": st["sm_clock_MHz"]["n"]}
    mon.close()
    assert nv.calls[-1] == "shutdown"


def test_sampler_leaves_out_the_settling_samples():
    class Ramp:
        def __init__(self):
            self.t0 = time.perf_counter()

        def read(self):                               # 100 W for the first 20 ms, then 700 W
            return 1980.0, 100.0 if time.perf_counter() - self.t0 < 0.02 else 700.0
    with R.Sampler(Ramp(), interval_s=0.001, skip_s=0.03) as s:
        time.sleep(0.06)
    assert s.stats()["power_W"]["min"] == 700.0
    assert min(p for _, _, p in s.samples) == 100.0
    with R.Sampler(Ramp(), interval_s=0.001, skip_s=10.0) as s:     # none that late: all of them
        pass
    assert s.stats()["power_W"]["n"] == len(s.samples)


def test_nvml_without_instant_power_falls_back_to_power_usage():
    mon = R.open_monitor(nvml=FakeNvml(instant=False), gpu=(False, None, 2))
    assert mon.read() == (1600.0, 400.0) and "nvmlDeviceGetPowerUsage" in mon.note
    assert ("index", 2) in mon.nvml.calls


def test_sampler_with_fake_amdsmi_on_hip():
    class Clk:
        GFX = "gfx"
    amd = types.SimpleNamespace(
        AmdSmiClkType=Clk, amdsmi_init=lambda: None, amdsmi_shut_down=lambda: None,
        amdsmi_get_processor_handles=lambda: ["p0", "p1"],
        amdsmi_get_clock_info=lambda h, t: {"clk": 2100},
        amdsmi_get_power_info=lambda h: {"current_socket_power": "N/A", "average_socket_power": 612})
    mon = R.open_monitor(nvml=FakeNvml(), amdsmi=amd, gpu=(True, None, 1))   # AMD: amdsmi first
    assert mon.name == "amdsmi" and mon.h == "p1"
    with R.Sampler(mon, interval_s=0.001) as s:
        time.sleep(0.005)
    assert s.stats()["sm_clock_MHz"]["mean"] == 2100.0 and s.stats()["power_W"]["max"] == 612.0


def test_no_library_gives_none_with_a_note(monkeypatch):
    real_import = builtins.__import__

    def no_monitors(name, *a, **k):
        if name in ("pynvml", "amdsmi"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_monitors)
    mon = R.open_monitor(gpu=(False, None, 0))
    assert mon.name is None and "nvidia-ml-py" in mon.note and "amdsmi" in mon.note
    with R.Sampler(mon, interval_s=0.001) as s:
        pass
    assert s.stats() == {"sm_clock_MHz": None, "power_W": None}
    assert mon.info() == {}


def test_nvml_without_a_gpu_is_a_note_not_a_crash():
    mon = R.open_monitor(nvml=FakeNvml(fail_init=True), amdsmi=None, gpu=(False, None, 0))
    assert mon.name is None and "NVML Shared Library Not Found" in mon.note
    assert mon.read() == (None, None)


# ----------------------------------------------------------------------------- timing method
class _FakeGraph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


def _bare_run(monkeypatch, capture_fails=()):
    """A _Run without a GPU: graph timing faked (a capture failure for the names in capture_fails), the CUDA calls
    no-ops, the monitor empty."""
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: None))
    run = object.__new__(R._Run)
    run.torch, run.quick, run.hold_s, run.reps = fake_torch, False, 0.01, 50
    run.result = {"notes": [], "rows": [], "ceilings": dict(CEIL)}
    run.monitor = R._NullMonitor("no monitor in this test")
    log = {"graph": [], "events": [], "graphs": []}

    def time_graph(fns, *, reps, keep=None, warmup=3):
        name = fns[0].__name__
        if name in capture_fails:
            raise RuntimeError("operation not permitted when stream is capturing")
        log["graph"].append((name, reps))
        g = _FakeGraph()
        log["graphs"].append(g)
        keep.append(g)
        return 10.0

    def time_rotating(fns, *, graph, reps=50):
        assert not graph
        log["events"].append((fns[0].__name__, reps))
        return 20.0

    monkeypatch.setattr(harness, "time_graph", time_graph)
    monkeypatch.setattr(harness, "time_rotating", time_rotating)
    return run, log


def _named(name):
    def f():
        return None
    f.__name__ = name
    return f


@pytest.mark.parametrize("M", [1, 256, 512, 16384])
def test_every_size_is_timed_as_graph_replays_and_held_on_that_graph(monkeypatch, M):
    """Events time the host's launch path wherever it outlasts the kernel (a Python op at mid-size M): every row is
    timed as graph replays, and the clock / power hold replays the same graph."""
    run, log = _bare_run(monkeypatch)
    us, stats, how = run.measure([_named("torch_matmul")], M, name="torch_matmul")
    assert (us, how) == (10.0, "graph") and log["events"] == []
    assert log["graph"] == [("torch_matmul", 50 if M <= R.FULL_REPS_MAX_M else 10)]
    assert log["graphs"][0].replays > 0
    row = run.row("o_proj", M, 4096, 4096, R.BF16, {"torch_matmul": us}, {"torch_matmul": stats},
                  {"torch_matmul": how})
    assert row["timing"] == "graph" and "timing_by_impl" not in row


def test_a_capture_failure_is_timed_with_events_noted_and_named_in_the_row(monkeypatch):
    run, log = _bare_run(monkeypatch, capture_fails=("rocjit_gemm_fp8_blockwise",))
    t, smp, how = {}, {}, {}
    for name in ("rocjit_gemm_fp8_blockwise", "torch_matmul"):
        t[name], smp[name], how[name] = run.measure([_named(name)], 4096, name=name)
    assert how == {"rocjit_gemm_fp8_blockwise": "events", "torch_matmul": "graph"}
    assert log["events"] == [("rocjit_gemm_fp8_blockwise", 10)]
    assert any("rocjit_gemm_fp8_blockwise" in n and "events" in n for n in run.result["notes"])
    row = run.row("o_proj", 4096, 4096, 4096, R.FP8_BLOCK, t, smp, how)
    assert row["timing"] == "mixed" and row["timing_by_impl"] == how


# ----------------------------------------------------------------------------- table and plot
def synthetic_result():
    r = {"suite": "roofline", "gpu": "NVIDIA H100 80GB HBM3", "commit": "abc1234", "date": "2026-01-01T00:00:00Z",
         "ceilings": dict(CEIL), "rows": [], "notes": ["rocjit.ops.gemm_fp8_blockwise is not in this build: skipped"],
         "monitor": {"monitor": "nvml", "power_limit_W": 700.0, "max_sm_clock_MHz": 1980.0}}

    def smp(clk, w):
        return {"sm_clock_MHz": {"min": clk - 50, "mean": clk, "max": clk + 50, "n": 5},
                "power_W": {"min": w - 20, "mean": w, "max": w + 20, "n": 5}}

    def add(case, M, N, K, dtype, eff: dict, data="random"):
        floor = R.roofline_us(M, N, K, dtype, CEIL)
        times = {k: floor / e for k, e in eff.items()}
        row = R.build_row(case, M, N, K, dtype, times, CEIL, samples={k: smp(1980 - M / 10, 200 + M / 20)
                                                                      for k in times}, data=data,
                          timing="graph" if M <= 256 else "events")
        harness.add_row(r, **{k: row.pop(k) for k in ("case", "shape", "dtype", "ours_us", "peers_us")},
                        floor=row.pop("floor_us"), **row)

    for name, M, N, K in R.shapes(quick=True):
        bf = {"torch_matmul": 0.8}
        f8 = {"cublaslt_fp8_tensorwise": 0.75, "cublaslt_fp8_rowwise": 0.7}
        if M <= 32:
            bf["rocjit_skinny_gemm"] = 0.9
            f8["rocjit_skinny_gemm"] = 0.85
        if M == 1:
            bf["rocjit_gemv"] = 0.95
        add(name, M, N, K, R.BF16, bf)
        add(name, M, N, K, R.FP8, f8)
        add(name, M, N, K, R.FP8_BLOCK, {"rocjit_gemm_fp8_blockwise": 0.6})
    for name, M, N, K in R.zeros_cases(quick=True):
        for i, kind in enumerate(R.DATA):
            add(f"zeros_{name}", M, N, K, R.BF16, {"torch_matmul": 0.7 + 0.08 * i}, data=kind)
            add(f"zeros_{name}", M, N, K, R.FP8, {"cublaslt_fp8_tensorwise": 0.6 + 0.1 * i}, data=kind)
    return r


def test_synthetic_result_is_json_and_series_leave_zeros_rows_out():
    r = synthetic_result()
    json.loads(json.dumps(r))
    s = R.series(r)
    assert ("rocjit_skinny_gemm", R.BF16) in s and ("rocjit_skinny_gemm", R.FP8) in s
    assert "rocjit_gemv" in s and "rocjit_gemm_fp8_blockwise" in s
    assert all(not row["case"].startswith("zeros_") for pts in s.values() for row, _ in pts)
    assert len(s["torch_matmul"]) == len(R.shapes(quick=True))


def test_table_has_a_line_per_implementation():
    r = synthetic_result()
    text = R.format_table(r)
    assert text.splitlines()[0].startswith("ceilings: copy 3000 GB/s, bf16 750 TFLOP/s, fp8 1300 TFLOP/s")
    assert "note: rocjit.ops.gemm_fp8_blockwise" in text
    n_impl = sum(len(x["peers_us"]) + len(x["rocjit_us"]) for x in r["rows"])
    assert len([ln for ln in text.splitlines() if ln.count(" | ") == 10]) == n_impl + 1
    start = "o_proj | 1x4096x4096 | bfloat16 | random | rocjit_gemv"
    line = next(ln for ln in text.splitlines() if ln.startswith(start))
    assert "| 95.0 |" in line


def test_plot_from_a_synthetic_result(tmp_path):
    pytest.importorskip("matplotlib")
    p = tmp_path / "roofline.png"
    R.plot(synthetic_result(), str(p))
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # without samples or zeros rows the plot says so instead of failing
    r = synthetic_result()
    r["rows"] = [x for x in r["rows"] if not x["case"].startswith("zeros_")]
    for x in r["rows"]:
        x["sm_clock_MHz"] = {k: None for k in x["sm_clock_MHz"]}
        x["power_W"] = {k: None for k in x["power_W"]}
    r["monitor"] = {}
    R.plot(r, str(tmp_path / "bare.png"))
    assert (tmp_path / "bare.png").stat().st_size > 0


def test_harness_uses_the_suites_table_and_plot(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(R, "run", lambda argv: synthetic_result())
    harness._run_suite("roofline", [], True, str(tmp_path / "roofline.json"))
    out = capsys.readouterr().out
    assert out.startswith("ceilings: copy") and "wrote" in out
    assert json.loads((tmp_path / "roofline.json").read_text())["suite"] == "roofline"
    assert (tmp_path / "roofline.png").read_bytes()[:4] == b"\x89PNG"


def test_suite_is_discovered():
    assert "roofline" in harness.SUITES
