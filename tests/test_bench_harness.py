"""The benchmark result format, table and plot (no GPU needed)."""
import json
import subprocess
import sys

import pytest

from rocjit.bench import harness


def _result():
    r = {"suite": "norm", "gpu": "NVIDIA H100 80GB HBM3", "commit": "abc1234", "date": "2026-01-01T00:00:00Z",
         "ceilings": {"copy_GBps": 3000.0}, "rows": []}
    for rows in (1, 2, 4):
        harness.add_row(r, "add_rms_fp8", [rows, 16384], "float16", 5.0 * rows,
                        {"torch_compile": 8.0 * rows, "eager": 30.0 * rows},
                        harness.floor_us(rows * 16384 * 7, r["ceilings"]))
    return r


def test_rows_have_the_shared_shape():
    r = _result()
    row = r["rows"][0]
    assert set(row) == {"case", "shape", "dtype", "ours_us", "peers_us", "floor_us"}
    assert abs(row["floor_us"] - 16384 * 7 / 3000e9 * 1e6) < 1e-9
    json.dumps(r)


def test_table_reports_speedups_and_sol():
    text = harness.format_table(_result())
    header, first = text.splitlines()[:2]
    assert "speedup_vs_torch_compile" in header and "SOL%" in header
    assert "1.60x" in first and "6.00x" in first          # 8/5 and 30/5


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")          # the `bench` extra; CI installs it
    p = tmp_path / "norm.png"
    harness.plot(_result(), str(p))
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gpu_slug():
    assert harness.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert harness.gpu_slug("NVIDIA H200") == "h200"
    assert harness.gpu_slug("AMD Instinct MI300X") == "mi300x"


def test_rotation_count_exceeds_l2():
    n = harness.rotation_count(10 << 20, l2_bytes=50 << 20)
    assert n * (10 << 20) > 2 * (50 << 20)
    assert harness.rotation_count(1 << 30, l2_bytes=50 << 20) == 2


@pytest.mark.parametrize("suite", harness.SUITES + ("all",))
def test_every_suite_without_gpu_stops_alike(suite, capsys, monkeypatch):
    """`all` and each single suite: the same one-line message on stderr and exit status 1, no traceback."""
    monkeypatch.setattr(harness, "gpu_missing", lambda: "no GPU visible to torch")
    assert harness.main([suite, "--quick"]) == 1
    out = capsys.readouterr()
    assert out.err == f"bench {suite}: no GPU visible to torch; nothing measured (benchmarks need a GPU)\n"
    assert out.out == ""


def test_bench_command_without_gpu_exits_1_without_traceback():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the suites would run")
    for suite in ("launch", "all"):
        out = subprocess.run([sys.executable, "-m", "rocjit", "bench", suite], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 1, out
        assert "no GPU visible to torch" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_gemm_fp8_runs_the_parts_it_is_asked_for(capsys):
    """bench gemm_fp8 --only: the parts named (every part by default); an unknown part is a usage error."""
    from rocjit.bench import gemm_fp8 as G
    assert G._args([]) == (False, set(G.PARTS))
    assert G._args(["--only", "step", "--quick"]) == (True, {"step"})
    assert G._args(["--only", "large, decode"]) == (False, {"large", "decode"})
    for bad in ("steps", ",", "large,prefill"):
        with pytest.raises(SystemExit):
            G._args(["--only", bad])
        assert "--only takes parts of large, decode, step" in capsys.readouterr().err


def test_gemm_fp8_plot_draws_a_panel_per_part(tmp_path, monkeypatch):
    """bench gemm_fp8's own plot: one panel per part present (large products as TFLOP/s bars, decode as speedup
    against M, the training step as µs bars); a result with none of them falls back to the shared plot."""
    pytest.importorskip("matplotlib")
    from rocjit.bench import gemm_fp8 as G

    def row(case, shape, us, peers, **kw):
        flops = 2.0 * shape[0] * shape[1] * shape[2]
        return dict(case=case, shape=list(shape), dtype="e4m3-bf16", ours_us=us, peers_us=peers, floor_us=None,
                    tflops=flops / us / 1e6, peers_tflops={k: flops / v / 1e6 for k, v in peers.items()}, **kw)
    big = (4096, 4096, 7168)
    rows = [row("gemm_fp8_blockwise_" + lay, big, us, {"cublaslt_blockwise": 200.0, "torch_matmul_bf16": 320.0})
            for lay, us in (("NT", 212.5), ("NN", 219.9), ("TN", 281.4))]
    rows.append(row("gemm_fp8_blockwise_NT_tma_192x128s5t3", big, 201.2, {"cublaslt_blockwise": 200.0}))
    rows += [row("gemm_fp8_blockwise_NT", (m, 7168, 2048), 5.9 + m / 64, {"cublaslt_blockwise": 9.5})
             for m in (1, 8, 128)]
    rows.append(row("mlp_train_step", (8192, 4096, 14336), 6700.0, {"torch_linear_bf16": 8900.0}))
    result = {"suite": "gemm_fp8", "gpu": "test GPU", "commit": "abc1234", "rows": rows,
              "ceilings": {"fp8_matmul_TFLOPs": 1465.0}}
    drawn = []
    import matplotlib.figure
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda self, *a, **k: (drawn.append([ax.get_title() for ax in self.axes]), real(self, *a, **k)))
    G.plot(result, str(tmp_path / "g.png"))
    assert (tmp_path / "g.png").stat().st_size > 10_000
    assert [t.split(",")[0].split(" ")[0] for t in drawn[-1]] == ["blockwise", "decode", "MLP"]
    G.plot(dict(result, rows=rows[:4]), str(tmp_path / "large.png"))
    assert len(drawn[-1]) == 1
    G.plot(dict(result, rows=[row("host_cost_NT", (128, 2112, 7168), 14.4, {"cublaslt_blockwise": 37.7})]),
           str(tmp_path / "host.png"))
    assert (tmp_path / "host.png").exists()
