"""The op skeleton on a CPU: the registry, the native Plans (rocjit/launcher.c) and what an eager call records.

CPU torch tensors stand in for GPU ones; launchers are Python callables that record what they were given, or a
native Launcher over a ctypes driver stub (as in test_native_launcher), so the replay's parameter block can be
compared with what the launcher itself packs."""
import importlib
import inspect
import pkgutil

import pytest

torch = pytest.importorskip("torch")

import rocjit.ops as ops  # noqa: E402
from rocjit import native  # noqa: E402
from rocjit.ops import _op  # noqa: E402
from tests.test_native_launcher import (KDL_CPU, STRUCT_FIELDS, Driver, Fallback, StructDriver,  # noqa: E402
                                        _spec, _struct_spec)


@pytest.fixture(scope="module")
def mod():
    m = native.module()
    if m is None:
        pytest.skip(f"the native launcher could not be built here: {native.status()}")
    return m


# ----------------------------------------------------------------------------- the registry
def test_every_public_op_comes_from_the_registry_and_no_module_shadows_one():
    for m in pkgutil.iter_modules(ops.__path__):        # import every submodule, as any user code may
        importlib.import_module(f"rocjit.ops.{m.name}")
        assert m.name not in ops.REGISTRY, f"module rocjit/ops/{m.name}.py is named like an op"
    assert set(ops.REGISTRY) >= {"rms_norm", "swiglu", "quantize_fp8", "quantize_fp8_weight", "quantize_fp8_dual",
                                 "gemv", "skinny_gemm"}
    for name, entry in ops.REGISTRY.items():
        assert getattr(ops, name) is entry.function and callable(getattr(ops, name)), name
        assert name in ops.__all__


def test_registry_entries_are_complete():
    from rocjit.bench import harness
    from rocjit.compiler import kernels_src_dir
    for name, entry in ops.REGISTRY.items():
        params = list(inspect.signature(entry.function).parameters.values())
        assert len(params) == len(entry.roles), name
        assert "call" not in [p.name for p in params]
        assert entry.function.__doc__, f"{name} has no docstring"
        assert entry.sources and all((kernels_src_dir() / s).is_file() for s in entry.sources), name
        assert entry.bench in harness.SUITES, f"{name}'s bench suite {entry.bench!r} does not exist"
        assert entry.custom_op is not None, name
    assert "decode" in harness.SUITES


def test_public_signatures_keep_keyword_only_parameters():
    sig = inspect.signature(ops.rms_norm)
    assert str(sig) == "(x, weight, eps=1e-06, *, residual=None, scale=None, quant=None, out=None, fp8_format=None)"
    with pytest.raises(TypeError):
        ops.rms_norm(torch.randn(2, 8).half(), torch.randn(8).half(), 1e-6, None)   # residual is keyword-only


def test_an_op_with_mismatched_roles_is_refused():
    with pytest.raises(ValueError, match="one letter per parameter"):
        _op.op(roles="T", name="_bad_roles")(lambda call, x, y: None)


# ----------------------------------------------------------------------------- Plans
class Rec:
    """A launcher that records its arguments."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kw):
        self.calls.append((args, kw))


def _plans(mod, roles="TTSO"):
    fb = Fallback()
    return mod.Plans(roles, fb, torch.Tensor.__dlpack_c_exchange_api__, (torch.Tensor, torch.nn.Parameter)), fb


def _out(shape, dtype=torch.float16, device="cpu"):
    return (tuple(shape), torch.empty(0, dtype=dtype, device=device).new_empty)


def test_a_matching_call_replays_outputs_and_launches(mod):
    P, fb = _plans(mod)
    rec = Rec()
    x, w, dummy = torch.randn(4, 64), torch.randn(64), torch.zeros(1)
    assert P.add((x, w, 1e-6, "a"), [_out((4, 64))], [dummy, 7],
                 [(rec, [("o", 0), ("a", 0), ("a", 1), ("a", 2), ("c", 0), ("c", 1), None], 0)],
                 [("o", 0), ("a", 1)], True, None)
    x2 = torch.randn(4, 64)
    y, w_back = P(x2, w, 0.5, "a")
    assert w_back is w and y.shape == (4, 64) and y.dtype == torch.float16
    (args, kw), = rec.calls
    assert args[0] is y and args[1] is x2 and args[2] is w and args[3] == 0.5 and args[4] is dummy
    assert args[5] == 7 and args[6] is None and kw == {}
    y2, _ = P(x2, w, 0.5, "a")
    assert y2.data_ptr() != y.data_ptr() or y is not y2          # a new output every call
    assert P.hits == 2 and fb.calls == []


def test_replayed_outputs_are_the_frameworks_own_tensors(mod):
    # made by torch.empty itself, not wrapped from DLPack: a storage of their own that torch's allocator knows
    # (on CUDA, Tensor.record_stream was silently ignored on wrapped tensors: tests/gpu/test_op_layer.py)
    P, _ = _plans(mod, "T")
    x = torch.randn(3)
    assert P.add((x,), [_out((2, 5), torch.float32), _out((), torch.int32), _out((0, 4), torch.bfloat16)], [],
                 [(Rec(), [("o", 0), ("o", 1), ("o", 2), ("a", 0)], 0)], [("o", 0), ("o", 1), ("o", 2)], True, None)
    a, b, c = P(torch.randn(3))
    assert (a.shape, a.dtype, b.shape, b.dtype, c.shape, c.dtype) == (
        (2, 5), torch.float32, (), torch.int32, (0, 4), torch.bfloat16)
    for t in (a, b, c):
        assert t.untyped_storage().resizable() and t._base is None and t.device == torch.device("cpu")
    assert P.hits == 1


def test_bad_output_descriptions_are_refused(mod):
    P, _ = _plans(mod, "T")
    x = torch.randn(3)
    make = torch.empty(0).new_empty
    for bad in [((2, -1), make), ((2.0,), make), ((1,) * 9, make), ((2,), "not callable"), ((2,),)]:
        with pytest.raises((ValueError, TypeError)):
            P.add((x,), [bad], [], [(Rec(), [("o", 0)], 0)], [("o", 0)], False, None)
    assert P.size == 0


@pytest.mark.parametrize("change", ["shape", "dtype", "stride", "alignment", "option_value", "option_type",
                                    "scalar_type", "none_for_tensor", "tensor_for_none", "numpy", "subclass",
                                    "keyword", "count"])
def test_every_change_of_the_key_takes_the_python_path(mod, change):
    P, fb = _plans(mod, "TTSOT")
    rec = Rec()
    x, w = torch.randn(4, 64), torch.randn(64)
    assert P.add((x, w, 1e-6, 1, None), [], [], [(rec, [("a", 0)], 0)], [("a", 0)], False, None)
    base = [torch.randn(4, 64), w, 0.5, 1, None]
    kw = {}
    if change == "shape":
        base[0] = torch.randn(5, 64)
    elif change == "dtype":
        base[0] = base[0].double()
    elif change == "stride":
        base[0] = torch.randn(64, 4).t()
    elif change == "alignment":
        base[0] = torch.randn(4 * 64 + 1)[1:].view(4, 64)
    elif change == "option_value":
        base[3] = 2
    elif change == "option_type":
        base[3] = True                  # == 1, but another type: a different choice of kernel
    elif change == "scalar_type":
        base[2] = 1
    elif change == "none_for_tensor":
        base[1] = None
    elif change == "tensor_for_none":
        base[4] = torch.randn(3)
    elif change == "numpy":
        base[0] = base[0].numpy()
    elif change == "subclass":
        class Sub(torch.Tensor):
            pass
        base[0] = base[0].as_subclass(Sub)
    elif change == "keyword":
        kw = {"extra": 1}
    elif change == "count":
        base = base[:-1]
    assert P(*base, **kw) == "fallback"
    assert rec.calls == [] and P.hits == 0 and len(fb.calls) == 1
    assert fb.calls[0][0] == tuple(base) and fb.calls[0][1] == kw


def test_plans_are_bounded_and_most_recent_first(mod):
    P, fb = _plans(mod, "T")
    rec = Rec()
    for n in range(mod.MAX_PLANS + 5):
        assert P.add((torch.randn(n + 1),), [], [], [(rec, [("a", 0)], 0)], [("a", 0)], False, None)
    assert P.size == mod.MAX_PLANS
    P(torch.randn(mod.MAX_PLANS + 5))
    P(torch.randn(1))                                       # evicted: the oldest went first
    assert P.hits == 1 and len(fb.calls) == 1
    P.clear()
    assert P.size == 0


def test_a_stream_bound_plan_replays_on_its_stream_only(mod):
    P, fb = _plans(mod, "T")
    rec = Rec()
    x = torch.randn(8)
    P.add((x,), [], [], [(rec, [("a", 0)], 0)], [("a", 0)], False, 12345)   # a CPU tensor's stream is null
    assert P(x) == "fallback" and P.hits == 0
    P.add((x,), [], [], [(rec, [("a", 0)], 0)], [("a", 0)], False, 0)
    assert P(x) is x and P.hits == 1


def test_a_plan_needs_a_tensor_and_one_device(mod):
    P, _ = _plans(mod, "OT")
    rec = Rec()
    assert P.add((1, None), [], [], [(rec, [], 0)], [None], False, None) is False
    with pytest.raises(ValueError):
        P.add((1, torch.randn(2)), [], [], [(rec, [("a", 5)], 0)], [None], False, None)   # a reference out of range


def test_replay_through_a_native_launcher_packs_what_the_launcher_packs(mod):
    """The plan hands the launcher's Spec its pointers directly; the driver sees what a direct call gives it."""
    drv, lfb = Driver(), Fallback()
    spec, _ = _spec(mod, drv)
    launcher = mod.Launcher(spec, (3, 1, 1), (64, 1, 1), lfb)
    P, fb = _plans(mod, "TTS")
    x = torch.randn(64)
    y = torch.randn(256)[4:]                              # 16-byte aligned
    refs = [("a", 2), ("a", 0), ("o", 0), ("c", 0), ("c", 1), ("c", 2), ("c", 3), ("c", 4)]
    consts = [7, 2**64 - 1, True, -0.125, -5]
    assert P.add((x, y, 2.5), [_out((252,), torch.float32)], consts,
                 [(launcher, refs, 0)], [("o", 0)], False, None)
    x2 = torch.randn(64)
    out = P(x2, y, 1.5)
    assert out.shape == (252,) and out.dtype == torch.float32
    assert lfb.calls == [] and fb.calls == [] and launcher.native_calls == 1 and P.direct == 1
    direct = (1.5, x2.data_ptr(), out.data_ptr(), 7, 2**64 - 1, True, -0.125, -5)
    assert drv.calls == [(0xF0, (3, 1, 1), (64, 1, 1), 0, 0, direct, None)]
    launcher(1.5, x2, out, *consts)                        # the launcher itself, for the same arguments
    assert drv.calls[1] == drv.calls[0]


@pytest.mark.parametrize("shared", [1024, 48 * 1024 + 1])
def test_replay_with_shared_memory_respects_the_functions_limit(mod, shared):
    """Dynamic shared memory goes straight to the driver within the limit the function was given; above it the
    plan calls the launcher, whose own path decides (here: its fallback)."""
    drv, lfb = Driver(), Fallback()
    spec, limits = _spec(mod, drv)
    launcher = mod.Launcher(spec, (1, 1, 1), (32, 1, 1), lfb)
    P, fb = _plans(mod, "TT")
    x, y = torch.randn(64), torch.randn(256)[4:]
    refs = [("c", 0), ("a", 0), ("a", 1), ("c", 1), ("c", 2), ("c", 3), ("c", 4), ("c", 5)]
    assert P.add((x, y), [], [2.5, 7, 5, True, -0.125, -5], [(launcher, refs, shared)], [("a", 0)], False, None)
    P(x, y)
    if shared <= limits[0]:
        assert P.direct == 1 and drv.calls[0][3] == shared and lfb.calls == []
    else:
        assert P.direct == 0 and drv.calls == [] and lfb.calls[0][1] == {"shared_mem": shared}


# ----------------------------------------------------------------------------- what a call records
class FakeKernel:
    """kernel[grid, block] for the recording tests: every configuration is one recording launcher."""

    def __init__(self):
        self.rec = Rec()
        self.name = "fake_kernel"
        self.params = [type("P", (), {"pointer": True})()] * 2 + [type("P", (), {"pointer": False})()]

    def __getitem__(self, cfg):
        return self.rec


@pytest.fixture
def fake_op(mod):
    kern = FakeKernel()

    def full(call, x, eps=1e-6, *, copy=False, out=None):
        y = call.empty(x.shape, x.dtype, x.device) if out is None else out
        src = x.clone() if copy else x
        call.launch(kern, 1, 32, y, src, eps)
        return call.done(y)

    fn = _op.op(roles="TSOT", name="_fake_op_for_tests")(full)
    yield fn, _op.REGISTRY["_fake_op_for_tests"], kern
    del _op.REGISTRY["_fake_op_for_tests"]


def test_a_second_call_replays_the_first(fake_op):
    fn, entry, kern = fake_op
    x = torch.randn(16)
    y1 = fn(x)
    assert entry.plans is not None and entry.plans.size == 1
    x2 = torch.randn(16)
    y2 = fn(x2, 0.25)
    assert entry.plans.hits == 1
    args = kern.rec.calls[-1][0]
    assert args[0] is y2 and args[1] is x2 and args[2] == 0.25 and y2 is not y1
    assert entry.last_plan == [("fake_kernel", 2, 1)]


def test_out_is_an_argument_of_the_plan(fake_op):
    fn, entry, kern = fake_op
    x, o1, o2 = torch.randn(16), torch.empty(16), torch.empty(16)
    assert fn(x, out=o1) is o1
    assert fn(x, out=o2) is o2 and entry.plans.hits == 1
    assert kern.rec.calls[-1][0][0] is o2


@pytest.mark.parametrize("why", ["unknown_tensor", "int_scalar"])
def test_what_a_plan_cannot_replay_leaves_no_plan(fake_op, why):
    fn, entry, kern = fake_op
    x = torch.randn(16)
    for _ in range(3):
        if why == "unknown_tensor":
            fn(x, copy=True)            # a copy made inside the call: not an argument, an output or a constant
        else:
            fn(x, 1)                    # an int for a forwarded float would be replayed as a constant
    assert entry.plans is None or entry.plans.size == 0
    assert len(kern.rec.calls) == 3


def test_op_plans_can_be_turned_off(fake_op, monkeypatch):
    fn, entry, kern = fake_op
    monkeypatch.setenv("ROCJIT_OP_PLANS", "0")
    x = torch.randn(16)
    fn(x)
    fn(x)
    assert entry.plans is None and len(kern.rec.calls) == 2


# ----------------------------------------------------------------------------- values derived from an address
class MapOf:
    """A stand-in for a tensor-map encoder: bytes that name the address they were made for."""

    def __init__(self):
        self.calls = []

    def __call__(self, address):
        self.calls.append(address)
        if address == 0xBAD:
            raise RuntimeError("no map")
        return address.to_bytes(8, "little") * 2


def test_a_derived_value_is_made_again_for_each_replay(mod):
    """A launch argument made from a tensor argument's address (a TMA tensor map) follows that tensor: the
    replay calls its maker with the new call's data pointer, through the Python launcher and through the native
    launcher's direct path alike."""
    drv, lfb = StructDriver(STRUCT_FIELDS), Fallback()
    native_l = mod.Launcher(_struct_spec(mod, drv), (1, 1, 1), (32, 1, 1), lfb)
    rec, make = Rec(), MapOf()
    P, fb = _plans(mod, "TT")
    x, w = torch.randn(8), torch.randn(8)
    assert P.add((x, w), [], [5], [(rec, [("a", 0), ("d", 0)], 0), (native_l, [("a", 0), ("d", 0), ("c", 0)], 0)],
                 [("a", 0)], False, None, None, [(make, 1)])
    for _ in range(3):
        w2 = torch.randn(8)
        assert P(x, w2) is x
        m = make(w2.data_ptr())
        assert rec.calls[-1][0] == (x, m) and drv.calls[-1][5] == (x.data_ptr(), m, 5)
    assert P.hits == 3 and P.direct == 3 and fb.calls == [] and lfb.calls == []


def test_a_derived_value_that_cannot_be_made_takes_the_python_path(mod):
    rec = Rec()
    P, fb = _plans(mod, "TT")
    x = torch.randn(8)

    class Failing(MapOf):
        def __call__(self, address):
            raise RuntimeError("no map")
    assert P.add((x, x), [], [], [(rec, [("d", 0)], 0)], [("a", 0)], False, None, None, [(Failing(), 1)])
    assert P(x, torch.randn(8)) == "fallback" and rec.calls == [] and P.hits == 0 and len(fb.calls) == 1


@pytest.mark.parametrize("derived", [[(MapOf(), 2)], [(MapOf(), 5)], [("not callable", 0)],
                                     [(MapOf(), 1)] * (_op.MAX_DERIVED + 1),
                                     [(MapOf(), 1), (MapOf(),)]])
def test_bad_derived_descriptions_are_refused(mod, derived):
    P, _ = _plans(mod, "TTS")
    x = torch.randn(8)
    with pytest.raises((ValueError, TypeError)):
        P.add((x, x, 1.0), [], [], [(Rec(), [("d", 0)], 0)], [("a", 0)], False, None, None, derived)
    with pytest.raises(ValueError, match="bad reference"):        # a reference to a derived value that is not there
        P.add((x, x, 1.0), [], [], [(Rec(), [("d", 1)], 0)], [("a", 0)], False, None, None, [(MapOf(), 0)])
    assert P.size == 0


def test_a_plan_holds_as_many_derived_values_as_call_derive_records(mod):
    P, _ = _plans(mod, "TT")
    x = torch.randn(8)
    refs = [("d", i) for i in range(_op.MAX_DERIVED)]
    assert P.add((x, x), [], [], [(Rec(), refs, 0)], [("a", 0)], False, None, None, [(MapOf(), 1)] * _op.MAX_DERIVED)


@pytest.fixture
def derived_op(mod):
    kern, make = FakeKernel(), MapOf()

    def full(call, x, w, *, of="w"):
        y = call.empty(x.shape, x.dtype, x.device)
        m = call.derive(make, {"w": w, "out": y}[of])
        call.launch(kern, 1, 32, y, x, m)
        return call.done(y)

    fn = _op.op(roles="TTO", name="_fake_derived_op_for_tests")(full)
    yield fn, _op.REGISTRY["_fake_derived_op_for_tests"], kern, make
    del _op.REGISTRY["_fake_derived_op_for_tests"]


def test_call_derive_records_a_value_that_follows_its_tensor(derived_op):
    fn, entry, kern, make = derived_op
    x = torch.randn(16)
    fn(x, torch.randn(16))
    for _ in range(3):
        w = torch.randn(16)
        y = fn(x, w)
        assert kern.rec.calls[-1][0] == (y, x, make(w.data_ptr()))
    assert entry.plans.hits == 3


def test_a_call_with_one_object_in_two_places_records_no_plan(derived_op):
    """Recorded from fn(x, x), a launch's reference to x could name either argument; a replay with two different
    tensors there must not pass the wrong one."""
    fn, entry, kern, make = derived_op
    x = torch.randn(16)
    fn(x, x)
    assert entry.plans is None or entry.plans.size == 0
    for _ in range(3):
        w = torch.randn(16)
        fn(x, w)
        assert kern.rec.calls[-1][0][1] is x and kern.rec.calls[-1][0][2] == make(w.data_ptr())
    assert entry.plans.hits == 2


def test_call_derive_of_anything_but_an_argument_leaves_no_plan(derived_op):
    fn, entry, kern, _ = derived_op
    x = torch.randn(16)
    for _ in range(3):
        fn(x, torch.randn(16), of="out")    # the output's address is new every call: no plan may keep its value
    assert entry.plans is None or entry.plans.size == 0
    assert len(kern.rec.calls) == 3


# ----------------------------------------------------------------------------- strided arguments, views
def test_limits_are_the_native_ones(mod):
    assert (_op.MAX_DERIVED, _op.MAX_VIEWS) == (mod.MAX_DERIVED, mod.MAX_VIEWS)


def test_a_strided_argument_is_keyed_by_its_strides(mod):
    """A tensor that is not contiguous keys its strides: a call with the same layout replays, one with the same
    shape in another layout (contiguous, or other strides) takes the Python path."""
    P, fb = _plans(mod, "T")
    rec = Rec()
    x = torch.randn(64, 4).t()                          # [4, 64], strides (1, 4)
    assert P.add((x,), [], [], [(rec, [("v", 0)], 0)], [("a", 0)], False, None)
    x2 = torch.randn(64, 4).t()
    assert P(x2) is x2 and rec.calls[-1][0] == (x2.data_ptr(),)
    for other in (torch.randn(4, 64), torch.randn(128, 4)[::2].t(), torch.randn(4, 64, 2)[:, :, 0]):
        assert other.shape == (4, 64)
        assert P(other) == "fallback"
    assert P.hits == 1 and len(fb.calls) == 3


def test_a_view_reference_passes_the_arguments_pointer(mod):
    """("v", i): a pointer parameter given a view of argument i gets that argument's data pointer, from the
    native launcher's direct path and, as an int, through a Python launcher alike."""
    drv, lfb = Driver(), Fallback()
    spec, _ = _spec(mod, drv)
    launcher = mod.Launcher(spec, (3, 1, 1), (64, 1, 1), lfb)
    P, fb = _plans(mod, "TTS")
    x = torch.randn(64)
    y = torch.randn(16, 16).t()                         # strided: the launcher itself takes no such tensor
    refs = [("a", 2), ("a", 0), ("v", 1), ("c", 0), ("c", 1), ("c", 2), ("c", 3), ("c", 4)]
    rec = Rec()
    assert P.add((x, y, 2.5), [], [7, 2**64 - 1, True, -0.125, -5],
                 [(launcher, refs, 0), (rec, [("v", 1), ("a", 0)], 0)], [("a", 0)], False, None)
    x2, y2 = torch.randn(64), torch.randn(16, 16).t()
    assert P(x2, y2, 1.5) is x2
    assert drv.calls[-1][5] == (1.5, x2.data_ptr(), y2.data_ptr(), 7, 2**64 - 1, True, -0.125, -5)
    assert rec.calls[-1][0] == (y2.data_ptr(), x2)
    assert P.direct == 1 and lfb.calls == [] and fb.calls == []


def test_a_strided_argument_given_as_it_is_is_left_to_the_launcher(mod):
    """("a", i) of a strided tensor is not packed directly (the launcher takes no strided tensor): the launcher's
    own path gets the tensor and decides."""
    drv, lfb = Driver(), Fallback()
    spec, _ = _spec(mod, drv)
    launcher = mod.Launcher(spec, (1, 1, 1), (32, 1, 1), lfb)
    P, _ = _plans(mod, "TT")
    x, y = torch.randn(64), torch.randn(16, 16).t()
    refs = [("c", 0), ("a", 0), ("a", 1), ("c", 1), ("c", 2), ("c", 3), ("c", 4), ("c", 5)]
    assert P.add((x, y), [], [2.5, 7, 5, True, -0.125, -5], [(launcher, refs, 0)], [("a", 0)], False, None)
    P(x, y)
    assert P.direct == 0 and drv.calls == [] and lfb.calls[0][0][2] is y


def test_result_views_are_made_again_from_each_replays_outputs(mod):
    P, fb = _plans(mod, "T")
    rec = Rec()
    x = torch.randn(8)
    assert P.add((x,), [_out((3, 5), torch.float32), _out((2, 4), torch.float32)], [],
                 [(rec, [("o", 0), ("o", 1), ("a", 0)], 0)], [("o", 0), ("w", 0), ("w", 1)], True, None, None, [],
                 [(torch.Tensor.t, 1), (lambda t: t[1:], 0)])
    for _ in range(2):
        a, b, c = P(torch.randn(8))
        o0, o1, _ = rec.calls[-1][0]
        assert a is o0 and b.shape == (4, 2) and b.stride() == (1, 4) and b.data_ptr() == o1.data_ptr()
        assert c.shape == (2, 5) and c.data_ptr() == o0[1:].data_ptr()
    assert P.hits == 2 and fb.calls == []


def test_bad_views_and_view_references_are_refused(mod):
    P, _ = _plans(mod, "TO")
    x = torch.randn(8)
    out = [_out((2, 4), torch.float32)]
    bad = [
        dict(views=[(torch.Tensor.t, 1)]),                                   # no output 1
        dict(views=[("not callable", 0)]),
        dict(views=[(torch.Tensor.t, 0)] * (_op.MAX_VIEWS + 1)),
        dict(result=[("w", 0)]),                                             # no view 0
        dict(result=[("v", 0)]),                                             # a pointer is not a result
        dict(launch=[("w", 0)], views=[(torch.Tensor.t, 0)]),                # views are made after the launches
        dict(launch=[("v", 1)]),                                             # argument 1 is an option
    ]
    for b in bad:
        with pytest.raises((ValueError, TypeError)):
            P.add((x, 3), out, [], [(Rec(), b.get("launch", [("o", 0)]), 0)], b.get("result", [("o", 0)]), False,
                  None, None, [], b.get("views", []))
    assert P.size == 0


@pytest.fixture
def view_op(mod):
    kern = FakeKernel()

    def full(call, x, w, *, alias_of="w", view_of="y"):
        y = call.empty((x.shape[0], 2), x.dtype, x.device)
        src = {"w": w, "x": x, "copy": w.clone()}[alias_of]
        wt = call.alias(w.t() if alias_of == "w" else src.t(), src)
        call.launch(kern, 1, 32, y, x, wt)
        return call.done((y, call.view(torch.Tensor.t, y if view_of == "y" else x)))

    fn = _op.op(roles="TTOO", name="_fake_view_op_for_tests")(full)
    yield fn, _op.REGISTRY["_fake_view_op_for_tests"], kern
    del _op.REGISTRY["_fake_view_op_for_tests"]


def test_call_alias_and_view_record_a_plan_that_follows_its_tensors(view_op):
    """A transposed (strided) argument handed to a kernel as a view at its address, and a result that is a view of
    an output: replays pass the new argument's pointer and return the new output's view."""
    fn, entry, kern = view_op
    x = torch.randn(16)
    fn(x, torch.randn(8, 16).t())
    for _ in range(3):
        w = torch.randn(8, 16).t()
        y, yt = fn(x, w)
        args = kern.rec.calls[-1][0]
        assert args[0] is y and args[1] is x and args[2] == w.data_ptr()
        assert yt.shape == (2, 16) and yt.data_ptr() == y.data_ptr()
    assert entry.plans.hits == 3
    fn(x, torch.randn(16, 8))                         # the same shape, contiguous: another key, the full path
    assert entry.plans.hits == 3


@pytest.mark.parametrize("why", [dict(alias_of="copy"), dict(view_of="x")])
def test_call_alias_and_view_of_anything_else_leave_no_plan(view_op, why):
    fn, entry, kern = view_op
    x = torch.randn(16)
    for _ in range(3):
        fn(x, torch.randn(8, 16).t(), **why)
    assert entry.plans is None or entry.plans.size == 0
    assert len(kern.rec.calls) == 3
