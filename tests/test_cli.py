"""`python -m rocjit`: --version, the doctor report, argument errors."""
import subprocess
import sys

import rocjit
from rocjit import __main__ as cli


def test_version_prints_the_version_only(capsys, monkeypatch):
    # the doctor must not run: make it fail loudly if it does
    monkeypatch.setattr(cli, "doctor", lambda argv=(): (_ for _ in ()).throw(AssertionError("doctor ran")))
    for flag in ("--version", "-V"):
        assert cli.main([flag]) == 0
        assert capsys.readouterr().out == f"rocjit {rocjit.__version__}\n"


def test_doctor_rejects_unknown_arguments(capsys):
    assert cli.main(["doctor", "--bogus"]) == 2
    assert "doctor takes no arguments" in capsys.readouterr().err


def test_amd_compiler_lines_are_readable():
    status = {"hiprtc": {"usable": True, "library": "libamdhip64.so.5", "version": "hiprtc 5.2.21153"},
              "clang": {"installed": False, "dir": "/opt/tc", "hint": "python -m rocjit toolchain install"},
              "targets": {"gfx90a": "hiprtc", "gfx942": "clang (not installed)"}}
    assert cli.amd_compiler_lines(status) == [
        "compiler hiprtc: hiprtc 5.2.21153  (libamdhip64.so.5)",
        "compiler clang : not installed in /opt/tc; python -m rocjit toolchain install",
        "AMD targets    : gfx90a -> hiprtc, gfx942 -> clang (not installed)",
    ]
    lines = cli.amd_compiler_lines({"hiprtc": {"usable": False, "reason": "libamdhip64.so not found"},
                                    "clang": {"installed": True, "path": "/x/clang", "version": "clang 22"}})
    assert lines == ["compiler hiprtc: unusable (libamdhip64.so not found)", "compiler clang : clang 22  (/x/clang)"]


def test_doctor_report_has_no_raw_containers():
    out = subprocess.run([sys.executable, "-m", "rocjit"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"rocjit {rocjit.__version__}")
    assert "compiler hiprtc" in out.stdout and "AMD targets" in out.stdout
    for raw in ("{'", "['", "':"):
        assert raw not in out.stdout, out.stdout
