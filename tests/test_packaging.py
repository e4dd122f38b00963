"""The wheel is pure Python, ships kernels_src/ inside the package, and works from another directory."""
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_kernel_sources_and_runs_elsewhere(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(ROOT)], check=True, capture_output=True, text=True)
    (whl,) = wheels.glob("rocjit-*.whl")
    assert whl.name.endswith("-py3-none-any.whl")
    readme = (ROOT / "README.md").read_text()
    assert f'"./dist/{whl.name}[' in readme, "the README's wheel install line names another file"
    names = zipfile.ZipFile(whl).namelist()
    assert "rocjit/kernels_src/rocjit/platform.h" in names
    assert "rocjit/kernels_src/cuda_shim/hip/hip_runtime.h" in names
    assert any(n.startswith("rocjit/kernels_src/") and n.endswith(".hip") for n in names)
    assert "rocjit/launcher.c" in names          # the native launcher's source, built on the user's machine
    assert "rocjit/torch_alloc.cpp" in names     # and the op plans' torch allocator
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(whl)],
                   check=True, capture_output=True, text=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("import rocjit, pathlib; d = rocjit.kernels_src_dir(); print(d); "
            "src = next(p for p in sorted(d.glob('*.hip'))); "
            "co = rocjit.compile('#include <hip/hip_runtime.h>\\n#include \"rocjit/warp.h\"\\n__global__ void k(){}\\n',"
            " 'sm_90a'); print(co.format); "
            "from rocjit import native; print(native.module() is not None, native.SOURCE.is_relative_to(d.parent))")
    out = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True, text=True,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                              "ROCJIT_CACHE_DIR": str(tmp_path / "cache")})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0].startswith(str(site)) and lines[1] == "cubin"
    from rocjit import native
    here = native.module() is not None           # where it builds in this checkout it must build from the wheel
    assert lines[2:] == [str(here), "True"], out.stdout + out.stderr


def _readme_pip_installs():
    import re
    text = (ROOT / "README.md").read_text()
    return re.findall(r"pip install\s+((?:-\S+\s+)*)(\"[^\"]+\"|'[^']+'|\S+)", text)


def test_readme_installs_name_paths_not_an_unpublished_package():
    """rocjit is on no package index: every `pip install` in the README installs a directory or a wheel file."""
    found = _readme_pip_installs()
    assert found
    for _flags, target in found:
        target = target.strip("\"'`")
        assert target.startswith((".", "./", "/")), f"README: `pip install {target}` needs a published package"


def test_readme_wheel_is_this_version():
    import re

    import rocjit
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert rocjit.__version__ == version
    wheels = [t.strip("\"'") for _f, t in _readme_pip_installs() if ".whl" in t]
    assert wheels and all(w.startswith(f"./dist/rocjit-{version}-py3-none-any.whl[") for w in wheels), wheels
