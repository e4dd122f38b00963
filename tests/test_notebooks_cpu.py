"""The notebooks' cells tagged `cpu` run, in order, without a GPU (the GPU suite runs every cell)."""
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _cpu_only(path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    nb.cells = [c for c in nb.cells if c.cell_type == "code" and "cpu" in c.metadata.get("tags", [])]
    return nb


def test_cells_promising_no_gpu_are_tagged_cpu():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(ROOT / "notebooks" / "01_quickstart.ipynb", as_version=4)
    promised = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and "no GPU needed" in c.source]
    assert promised
    for i in promised:
        assert "cpu" in nb.cells[i + 1].metadata.get("tags", []), nb.cells[i + 1].source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_cpu_cells_run_without_gpu(path, tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the GPU suite runs every cell")
    nb = _cpu_only(path)
    assert nb.cells, f"{path.name} has no cells tagged cpu"
    # the kernel imports this checkout's rocjit, whatever is installed
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells for o in c.outputs if o.output_type == "stream")
    errors = [o for c in nb.cells for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    if path.name.startswith("01"):
        assert f"kernel sources : {ROOT / 'kernels_src'}" in text          # the doctor ran, on this checkout
        assert re.search(r"<CodeObject sm_90a cubin, \d+ bytes, kernels \[axpy\]", text), text
        assert "axpy" in text.split("<CodeObject sm_90a", 1)[1]            # its resource table follows
        if os.environ.get("ROCJIT_REQUIRE_AMD") == "1":
            assert "<CodeObject gfx942 hsaco" in text, text
    elif path.name.startswith("02"):
        assert "rms_norm_kernel<" in text and "sm_90a" in text, text
    else:
        assert "families rocjit patches: llama, mistral, qwen2, qwen3" in text, text
