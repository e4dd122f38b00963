"""The vendor seam: cuda.py, hip.py and the CPU stand-in each implement the whole Platform protocol, with the
protocol's parameter names, and the core never probes a platform for optional methods."""
import inspect
import re
from pathlib import Path

import pytest

from rocjit import platform
from rocjit.platform import Platform, cuda, hip
from tests.fakeplatform import FakePlatform

MEMBERS = sorted(n for n in dir(Platform) if not n.startswith("_"))
ATTRIBUTES = sorted(Platform.__annotations__)
ROCJIT = Path(platform.__file__).resolve().parent.parent


def _params(fn):
    return [p for p in inspect.signature(fn).parameters if p != "self"]


@pytest.mark.parametrize("impl", [cuda, hip, FakePlatform(lambda params: 0)], ids=["cuda", "hip", "fake"])
def test_every_member_is_implemented_with_the_protocols_signature(impl):
    assert ATTRIBUTES == ["DLPACK_DEVICE_TYPE", "NAME"]
    for name in ATTRIBUTES:
        assert hasattr(impl, name), f"{impl} lacks {name}"
    for name in MEMBERS:
        assert callable(getattr(impl, name, None)), f"{impl} lacks {name}()"
        assert _params(getattr(impl, name)) == _params(getattr(Platform, name)), name
    assert isinstance(impl, Platform)


def test_dlpack_device_types():
    assert (cuda.DLPACK_DEVICE_TYPE, hip.DLPACK_DEVICE_TYPE) == (2, 10)     # kDLCUDA, kDLROCM


def test_no_platform_probes_in_the_core():
    probes = []
    for path in ROCJIT.rglob("*.py"):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\b(getattr|hasattr)\(\s*(plat|platform)\b", line):
                probes.append(f"{path.relative_to(ROCJIT)}:{i}: {line.strip()}")
    assert probes == []


def test_vendor_decision_is_made_in_targets_only():
    """`sm_` / `gfx` prefixes are read by rocjit.targets (the kernel library keeps its own per-op choices)."""
    found = []
    for path in ROCJIT.rglob("*.py"):
        rel = path.relative_to(ROCJIT)
        if rel.parts[0] in ("ops", "bench") or rel.name in ("targets.py", "check.py"):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"startswith\(\(?\"(sm_|gfx|compute_)", line):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert found == []
