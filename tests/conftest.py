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
