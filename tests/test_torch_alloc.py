"""rocjit's torch allocator (rocjit/torch_alloc.cpp, built against the installed torch): Empty(prototype)(*sizes)
gives what prototype.new_empty(sizes) gives, and the op plans allocate their outputs with it -- once it is loaded,
and with new_empty while it is still being built in the background (those plans record again when it lands)."""
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from rocjit import native  # noqa: E402
from rocjit.ops import _op  # noqa: E402
from tests.test_op_plans import FakeKernel  # noqa: E402


@pytest.fixture(scope="module")
def alloc():
    m = native.torch_alloc()
    if m is None:
        pytest.skip(f"the torch allocator could not be built here: {native.torch_alloc_status()}")
    return m


def _same_as_new_empty(t, proto, sizes):
    ref = proto.new_empty(sizes)
    assert type(t) is torch.Tensor
    assert (t.shape, t.dtype, t.device, t.layout, t.stride()) == (ref.shape, ref.dtype, ref.device, ref.layout,
                                                                  ref.stride())
    assert not t.requires_grad and t.grad_fn is None and t._base is None and t.storage_offset() == 0
    assert t.untyped_storage().nbytes() == ref.untyped_storage().nbytes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int32,
                                   torch.uint8, torch.bool])
@pytest.mark.parametrize("sizes", [(3, 5), (7,), (), (0, 4), (2, 3, 1, 5)])
def test_empty_makes_what_new_empty_makes(alloc, dtype, sizes):
    proto = torch.empty(0, dtype=dtype)
    make = alloc.Empty(proto)
    _same_as_new_empty(make(*sizes), proto, sizes)
    _same_as_new_empty(make(sizes), proto, sizes)          # the tuple form, as new_empty takes it
    a, b = make(*sizes), make(*sizes)
    if a.numel():
        assert a.data_ptr() != b.data_ptr()                 # a new tensor every call
    assert repr(make).startswith("rocjit Empty(") and repr(make).endswith(", cpu)")


def test_empty_tensors_are_writable_and_independent(alloc):
    make = alloc.Empty(torch.empty(0))
    a, b = make(64), make(64)
    a.copy_(torch.arange(64.0))
    b.fill_(-1.0)
    assert torch.equal(a, torch.arange(64.0)) and bool((b == -1).all())
    a.resize_(128)                          # its own resizable storage, as new_empty's
    assert a.shape == (128,) and torch.equal(a[:64], torch.arange(64.0))


def test_empty_follows_inference_mode_as_new_empty_does(alloc):
    proto = torch.empty(0)
    make = alloc.Empty(proto)
    with torch.inference_mode():
        assert make(4).is_inference() == proto.new_empty(4).is_inference() is True
    assert make(4).is_inference() is False


def test_bad_sizes_and_prototypes_get_named_errors(alloc):
    make = alloc.Empty(torch.empty(0))
    with pytest.raises(TypeError, match="size 1 must be an int, not float"):
        make(2, 3.0)
    with pytest.raises(TypeError, match="size 0 must be an int, not str"):
        make("4")
    with pytest.raises(RuntimeError, match="negative"):
        make(2, -1)
    with pytest.raises(ValueError, match="at most 16 dimensions"):
        make(*([1] * 17))
    with pytest.raises(TypeError, match="keyword"):
        make(2, device="cpu")
    with pytest.raises(OverflowError):
        make(2 ** 70)
    with pytest.raises(TypeError, match="prototype must be a torch.Tensor, not list"):
        alloc.Empty([1, 2])
    with pytest.raises(ValueError, match="strided"):
        alloc.Empty(torch.empty(0, 3).to_sparse())


def test_op_plans_allocate_with_the_torch_allocator(alloc):
    made, kept = _op._maker(torch.bfloat16, torch.device("cpu"))
    assert isinstance(made, alloc.Empty) and kept
    kern = FakeKernel()

    def full(call, x, eps=1e-6):
        y = call.empty(x.shape, x.dtype, x.device)
        call.launch(kern, 1, 32, y, x, eps)
        return call.done(y)

    fn = _op.op(roles="TS", name="_fake_alloc_op_for_tests")(full)
    try:
        entry = _op.REGISTRY["_fake_alloc_op_for_tests"]
        x = torch.randn(5, 3).to(torch.bfloat16)
        fn(x)
        y = fn(x, 0.5)
        assert entry.plans.hits == 1 and kern.rec.calls[-1][0][0] is y
        _same_as_new_empty(y, x, (5, 3))
    finally:
        del _op.REGISTRY["_fake_alloc_op_for_tests"]


def test_plans_made_while_the_allocator_builds_record_again_once_it_lands(monkeypatch):
    """While the build runs, plans take new_empty and are not kept; its end clears every op's plans."""
    pending = []
    monkeypatch.setattr(native, "torch_alloc", lambda wait=True: None)
    monkeypatch.setattr(native, "torch_alloc_building", lambda: True)
    monkeypatch.setattr(native, "on_torch_alloc", pending.append)
    monkeypatch.setattr(_op, "_MAKERS", {})
    made, kept = _op._maker(torch.float32, torch.device("cpu"))
    assert not kept and made.__name__ == "new_empty" and pending == [_op.clear_plans]
    assert _op._MAKERS == {}                # asked again at the next plan


_BACKGROUND = textwrap.dedent("""
    import torch, time
    from rocjit import native
    assert native.torch_alloc(wait=False) is None and native.torch_alloc_building(), native.torch_alloc_status()
    fired = []
    native.on_torch_alloc(lambda: fired.append(native.torch_alloc_status()))
    t = time.time()
    while not fired and time.time() - t < 280:
        time.sleep(0.05)
    m = native.torch_alloc(wait=False)
    print("RESULT", fired[0].split(" ")[0], m is not None and m.Empty(torch.empty(0))(3).shape == (3,))
""")


def test_a_process_without_a_cached_build_builds_it_in_the_background(tmp_path, alloc):
    env = dict(os.environ, ROCJIT_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", _BACKGROUND], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("RESULT")[-1].split() == ["ready", "True"]


def test_the_torch_allocator_can_be_turned_off(tmp_path):
    code = ("import torch; from rocjit import native; "
            "print('RESULT', native.torch_alloc(wait=False), native.torch_alloc_status())")
    env = dict(os.environ, ROCJIT_TORCH_ALLOC="0", ROCJIT_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("ROCJIT_REQUIRE_NATIVE", None)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("RESULT")[-1].strip() == "None off (ROCJIT_TORCH_ALLOC=0)"


# ----------------------------------------------------------------------------- Outputs: a call's outputs at once
_SPECS = [(torch.float8_e4m3fn, (3, 4096)), (torch.float32, (3, 1)), (torch.bfloat16, ()), (torch.int32, (0, 5)),
          (torch.float16, (2, 3, 7))]


@pytest.mark.parametrize("share_limit", [0, 1 << 20])
def test_outputs_make_what_new_empty_makes(alloc, share_limit):
    protos = [torch.empty(0, dtype=dt) for dt, _ in _SPECS]
    make = alloc.Outputs([(p, s) for p, (_, s) in zip(protos, _SPECS)], share_limit=share_limit)
    assert make.shared == bool(share_limit)
    outs = make()
    assert type(outs) is tuple and len(outs) == len(_SPECS)
    for t, p, (_, sizes) in zip(outs, protos, _SPECS):
        ref = p.new_empty(sizes)
        assert type(t) is torch.Tensor and (t.shape, t.dtype, t.device, t.stride()) == (ref.shape, ref.dtype,
                                                                                        ref.device, ref.stride())
        assert t.is_contiguous() and not t.requires_grad and t._base is None
    # each one writable on its own: no two overlap
    for i, t in enumerate(outs):
        t.view(-1).view(torch.uint8).fill_(i + 1) if t.numel() else None
    for i, t in enumerate(outs):
        if t.numel():
            assert bool((t.reshape(-1).view(torch.uint8) == i + 1).all())
    bases = {t.untyped_storage().data_ptr() for t in outs if t.numel()}
    if share_limit:             # one block, each output at a 256-byte offset
        assert len(bases) == 1
        assert all((t.data_ptr() - outs[0].data_ptr()) % 256 == 0 for t in outs if t.numel())
    else:
        assert len(bases) == sum(1 for t in outs if t.numel())
        assert all(t.storage_offset() == 0 for t in outs)
    again = make()
    assert again[0].data_ptr() != outs[0].data_ptr()          # new tensors every call
    assert repr(make).startswith("rocjit Outputs(5 on cpu")


def test_outputs_share_one_block_only_up_to_the_limit(alloc):
    p = torch.empty(0)
    assert alloc.Outputs([(p, (100,)), (p, (100,))], share_limit=1024).shared          # 2 x 512 bytes
    assert not alloc.Outputs([(p, (100,)), (p, (100,))], share_limit=1023).shared
    assert not alloc.Outputs([(p, (100,))], share_limit=1 << 20).shared                 # one output: its own
    assert not alloc.Outputs([(p, (2 ** 40, 2 ** 40)), (p, (1,))], share_limit=1 << 62).shared   # overflows


def test_outputs_follow_inference_mode_and_keep_their_block_alive(alloc):
    p = torch.empty(0)
    make = alloc.Outputs([(p, (4,)), (p, (2,))], share_limit=1 << 20)
    with torch.inference_mode():
        assert all(t.is_inference() for t in make())
    assert not any(t.is_inference() for t in make())
    a, b = make()
    b.fill_(7.0)
    del a                                   # the block lives on with b
    assert torch.equal(b, torch.full((2,), 7.0))


def test_outputs_bad_specs_get_named_errors(alloc):
    p = torch.empty(0)
    with pytest.raises(ValueError, match="1 to 8 outputs"):
        alloc.Outputs([])
    with pytest.raises(ValueError, match="1 to 8 outputs"):
        alloc.Outputs([(p, (1,))] * 9)
    with pytest.raises(TypeError, match="spec 1 must be \\(prototype tensor, sizes tuple\\)"):
        alloc.Outputs([(p, (1,)), (p, [1])])
    with pytest.raises(TypeError, match="spec 0's prototype must be a torch.Tensor, not int"):
        alloc.Outputs([(3, (1,))])
    with pytest.raises(ValueError, match="spec 0's sizes must be ints >= 0"):
        alloc.Outputs([(p, (2, -1))])
    with pytest.raises(ValueError, match="spec 0's sizes must be ints >= 0"):
        alloc.Outputs([(p, (2 ** 70,))])
    with pytest.raises(ValueError, match="more than 16 dimensions"):
        alloc.Outputs([(p, (1,) * 17)])
    with pytest.raises(ValueError, match="strided"):
        alloc.Outputs([(torch.empty(0, 3).to_sparse(), (1,))])
    with pytest.raises(TypeError, match="takes no arguments"):
        alloc.Outputs([(p, (1,))])(3)


def _two_output_op(kern, name):
    def full(call, x, eps=1e-6):
        q = call.empty(x.shape, torch.float8_e4m3fn, x.device)
        s = call.empty((x.shape[0], 1), torch.float32, x.device)
        call.launch(kern, 1, 32, q, s, x, eps)
        return call.done((q, s))
    return _op.op(roles="TS", name=name)(full)


def test_plans_make_their_outputs_in_one_call(alloc):
    """A plan's outputs come from one Outputs call (no Python per output): small ones from one block, large ones
    each from its own (keeping one alive never keeps the others' memory)."""
    assert native.allocator_registered()
    kern = FakeKernel()
    fn = _two_output_op(kern, "_fake_two_output_op_for_tests")
    try:
        entry = _op.REGISTRY["_fake_two_output_op_for_tests"]
        for rows, shared in ((4, True), (_op.SHARE_LIMIT // 64 + 1, False)):
            x = torch.randn(rows, 64)
            fn(x)
            hits = entry.plans.hits
            q, s = fn(x, 0.5)
            assert entry.plans.hits == hits + 1
            launched = kern.rec.calls[-1][0]
            assert launched[0] is q and launched[1] is s and launched[2] is x and launched[3] == 0.5
            assert (q.shape, q.dtype, s.shape, s.dtype) == ((rows, 64), torch.float8_e4m3fn, (rows, 1), torch.float32)
            assert (q.untyped_storage().data_ptr() == s.untyped_storage().data_ptr()) is shared
            q2, _ = fn(x, 0.5)
            assert q2.data_ptr() != q.data_ptr()
    finally:
        del _op.REGISTRY["_fake_two_output_op_for_tests"]


def test_plans_refuse_a_group_that_does_not_match_their_outputs(alloc):
    assert native.allocator_registered()
    launch = native.module()
    api = torch.Tensor.__dlpack_c_exchange_api__
    plans = launch.Plans("T", lambda x: None, api, (torch.Tensor,))
    x = torch.randn(3)
    group = alloc.Outputs([(x, (3,)), (x, (3,))])
    with pytest.raises(ValueError, match="group: the registered allocator's Outputs, one per output"):
        plans.add((x,), [((3,), x.new_empty)], [], [], [("o", 0)], False, None, group)
    with pytest.raises(ValueError, match="group"):
        plans.add((x,), [((3,), x.new_empty)], [], [], [("o", 0)], False, None, "not a group")


def test_outputs_take_at_empty_s_allocator_and_its_storage_rules(alloc):
    """Blocks come straight from the allocator at::empty uses; the storage is what new_empty's is (its size,
    resizable), and torch's deterministic mode (new memory filled with NaN) goes through at::empty itself."""
    p = torch.empty(0, dtype=torch.bfloat16)
    make = alloc.Outputs([(p, (3, 5))])
    assert make.direct
    t, = make()
    ref = p.new_empty((3, 5))
    assert t.untyped_storage().nbytes() == ref.untyped_storage().nbytes() and t.untyped_storage().resizable()
    t.resize_(100)
    assert t.shape == (100,)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert not make.direct
        t, = make()
        assert torch.isnan(t).all()
    finally:
        torch.use_deterministic_algorithms(was)
    assert make.direct
