import os
import tempfile

import pytest

# Every test session gets its own code-object cache, so tests never depend on (or pollute) the user's.
_CACHE = tempfile.mkdtemp(prefix="rocjit-test-cache-")
os.environ.setdefault("ROCJIT_CACHE_DIR", _CACHE)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("ROCJIT_CACHE_DIR", str(d))
    from rocjit import compiler
    compiler._memory.clear()
    yield d
    compiler._memory.clear()


def pytest_sessionstart(session):
    """Build (or load) rocjit's torch allocator before any test records an op plan: a build started in the
    background by the first plan would drop every plan when it lands, in the middle of some other test."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    from rocjit import native
    native.torch_alloc(wait=True)
