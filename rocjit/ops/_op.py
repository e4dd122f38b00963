"""The skeleton every op of the library stands on.

An op is written once, as its full path: a function whose first parameter is a `Call` and whose other parameters
are the public signature. ``@op(...)`` turns it into the public function and registers it:

    @op(roles="TTS", sources=("my_op.hip",), bench="my_op")
    def my_op(call, x, w, eps=1e-6):
        "docstring of the public function"
        ...checks that name the argument...
        y = call.empty(x.shape, x.dtype, x.device)
        call.launch(kernel, grid, block, y, x, w, eps, rows)
        return call.done(y)

What the skeleton gives every op:
- **the eager fast path.** A call with torch tensors records what it did (the outputs it allocated and the
  launches it made, each launch argument named as an op argument, an output or a constant) into the op's
  native `Plans` (rocjit/launcher.c). A later call whose arguments match -- every tensor's dtype, shape, device,
  strides where it is not contiguous, 16-byte alignment, each forwarded scalar's type, each option's value -- is
  replayed in C: one
  torch allocation per output, or one for all of them where they are small (rocjit's torch allocator, else a
  prototype's new_empty; see _maker and _group) and the same native launchers. Anything else takes the full path
  again, so every check and every error message stays where it is
  written. `roles` says, per parameter, what a call's key reads: ``T`` a tensor or None, ``S`` a float forwarded
  to the kernels as it is (its value is not part of the key), ``O`` an option compared by value.
- **safety of the record.** A launch argument that is a tensor the record does not know (a copy, a view, a
  converted numpy array), an int that is not fixed by the key, one object passed in two places (which of the two
  a launch means is not known: `f(x, x)` recorded, `f(x, w)` replayed, would pass x for w), or a call made while a
  CUDA graph is captured leaves no plan. A plan that holds per-stream state (`Call.bind_stream`) is replayed on that stream only. A
  launch argument made from a tensor argument's address (`Call.derive`: a TMA tensor map) is made again by the
  replay, in C, for the replay's tensor. A view of a tensor argument that starts at its address (`Call.alias`: a
  transpose, a uint8 view) is passed to a kernel as that argument's data pointer, and a result that is a view of an
  output (`Call.view`: a transpose) is made again by the replay with the same function.
- **torch.compile.** While dynamo traces, the public function runs the full path, which calls the op's
  `torch.ops.rocjit.<name>` custom op (registered from the op's `custom_op` builder). An op whose checks take
  any strides may say `flexible_layout=True` (torch's tag): inductor then hands it buffers as they are, where it
  would otherwise make a copy in eager strides for each call.
- **one registry** (`REGISTRY`) that `rocjit.ops`' public names, custom-op registration, the bench suites and
  the tests read: adding an op is its .hip, its module here, its bench and its tests.
"""
from __future__ import annotations

import inspect
import os
import sys
from dataclasses import dataclass
from typing import Callable

REGISTRY: dict[str, "Op"] = {}
MAX_DERIVED = 4         # derived launch arguments a plan holds (RJ_MAX_DERIVED in rocjit/launcher.c)
MAX_VIEWS = 4           # result views a plan holds (RJ_MAX_VIEWS in rocjit/launcher.c)


@dataclass
class Op:
    name: str
    function: Callable                   # the public function
    full: Callable                       # the full path, full(call, *args)
    roles: str
    sources: tuple = ()                  # kernels_src files the op compiles
    bench: str | None = None             # `python -m rocjit bench <suite>` that measures it
    custom_op: Callable | None = None    # () -> (impl, fake) of torch.ops.rocjit.<name>
    mutates_args: tuple = ()
    flexible_layout: bool = False        # the custom op takes any strides it checks (see _common.custom_op)
    state: "_State" = None               # read by the public function on every call
    plans: object = None                 # the native Plans, made at the first eager torch call
    last_plan: list = None               # [(kernel, pointer params, scalar params)] of the last plan recorded
    last_outputs: list = None            # [(torch dtype, shape)] that the last plan recorded allocates

    def torch_op(self):
        """torch.ops.rocjit.<name>, registered on first use."""
        from rocjit.ops import _common as C
        if self.custom_op is None:
            raise RuntimeError(f"{self.name} has no torch custom op")
        return C.custom_op(self.name, self.custom_op, mutates_args=self.mutates_args,
                           flexible_layout=self.flexible_layout)

    def clear_plans(self):
        if self.plans is not None:
            self.plans.clear()


class _State:
    """What the generated public function reads on every call (two attribute loads)."""
    __slots__ = ("call", "compiling")

    def __init__(self):
        self.call = None
        self.compiling = _never


def _never() -> bool:
    return False


def fast_path_enabled() -> bool:
    return os.environ.get("ROCJIT_OP_PLANS", "1") != "0"


def op(*, roles: str, sources=(), bench: str | None = None, custom_op: Callable | None = None,
       mutates_args=(), name: str | None = None, flexible_layout: bool = False):
    """Register `full(call, *params)` as an op and return its public function (same parameters, no `call`)."""
    def deco(full):
        op_name = name or full.__name__
        if op_name in REGISTRY:
            raise ValueError(f"op {op_name!r} is registered twice")
        sig = inspect.signature(full)
        params = list(sig.parameters.values())[1:]
        if len(params) != len(roles):
            raise ValueError(f"{op_name}: roles {roles!r} must have one letter per parameter ({len(params)})")
        public = _public_function(op_name, full, params, sig)
        entry = Op(op_name, public, full, roles, tuple(sources), bench, custom_op, tuple(mutates_args),
                   flexible_layout, public.__rocjit_state__)
        entry.state.call = _python_path(entry)
        public.__rocjit_op__ = entry
        REGISTRY[op_name] = entry
        return public
    return deco


# The public functions' one global namespace: torch.compile traces them, and an object (UNRECORDED) reached
# through several namespaces would cost a Python-evaluated aliasing guard per op and compiled call.
_PUBLIC_GLOBALS: dict = {}


def _public_function(op_name, full, params, sig):
    """def <name>(<params as declared>): the plans (or the full path) called with every parameter by position."""
    env = _PUBLIC_GLOBALS
    decl = []
    star_done = False
    for p in params:
        if p.kind is p.KEYWORD_ONLY and not star_done:
            decl.append("*")
            star_done = True
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise ValueError(f"{op_name}: parameter {p.name} must be positional-or-keyword or keyword-only")
        if p.default is p.empty:
            decl.append(p.name)
        else:
            env[f"_{op_name}_default_{p.name}"] = p.default
            decl.append(f"{p.name}=_{op_name}_default_{p.name}")
    names = ", ".join(p.name for p in params)
    src = (f"def {op_name}({', '.join(decl)}):\n"
           f"    if _{op_name}_state.compiling():\n"
           f"        return _{op_name}_full(UNRECORDED, {_call_args(params)})\n"
           f"    return _{op_name}_state.call({names})\n")
    env["UNRECORDED"] = UNRECORDED
    env[f"_{op_name}_full"] = full
    holder = _State()
    env[f"_{op_name}_state"] = holder
    exec(compile(src, f"<rocjit op {op_name}>", "exec"), env)
    fn = env.pop(op_name)
    fn.__doc__ = full.__doc__
    fn.__module__ = full.__module__
    fn.__qualname__ = op_name
    fn.__rocjit_state__ = holder
    fn.__signature__ = sig.replace(parameters=params)
    return fn


def _call_args(params) -> str:
    """The arguments of a call of the full path: keyword-only parameters by keyword."""
    return ", ".join(p.name if p.kind is p.POSITIONAL_OR_KEYWORD else f"{p.name}={p.name}" for p in params)


def _python_path(entry: Op):
    """The call target before the native plans exist, and their fallback: the full path, recording a plan.
    Called with every parameter by position."""
    params = list(inspect.signature(entry.full).parameters.values())[1:]
    names = ", ".join(p.name for p in params)
    src = (f"def python_path({names}):\n"
           f"    return full(Call(entry, ({names},)), {_call_args(params)})\n")
    env = {"full": entry.full, "Call": Call, "entry": entry}
    exec(compile(src, f"<rocjit op {entry.name} full path>", "exec"), env)
    return env["python_path"]


def _activate(entry: Op) -> None:
    """Swap in the native Plans (the first eager call with torch tensors); no native module: stay in Python."""
    holder = entry.state
    from rocjit.ops import _common as C
    tm = C.torch()
    holder.compiling = tm.compiler.is_compiling
    if entry.plans is not None or not fast_path_enabled():
        return
    from rocjit import native
    mod = native.module()
    api = getattr(tm.Tensor, "__dlpack_c_exchange_api__", None)
    if mod is None or api is None or not hasattr(mod, "Plans"):
        return
    try:
        entry.plans = mod.Plans(entry.roles, _python_path(entry), api, (tm.Tensor, tm.nn.Parameter))
    except ValueError:          # an exchange API without what plans need: the Python path does every call
        return
    holder.call = entry.plans


# ----------------------------------------------------------------------------- the record of one call
class Call:
    """Runs an op's allocations and launches, and records them as a plan when the call can be one.

    `Call(None)` (torch.compile's path, the tuner, tests) only runs them."""
    __slots__ = ("op", "args", "_known", "_outs", "_consts", "_derived", "_views", "_launches", "_stream", "ok")

    def __init__(self, entry: Op | None, args: tuple = ()):
        self.op, self.args = entry, args
        self.ok = entry is not None and fast_path_enabled()
        self._known = {}
        if self.ok:
            for i, (a, role) in enumerate(zip(args, entry.roles)):
                if role == "S" and type(a) is not float:    # an int or bool would be recorded as a constant
                    self.ok = False
                if role == "S" or (role == "T" and a is not None):
                    if id(a) in self._known:    # one object in two places: which one a launch means is unknown, and
                        self.ok = False         # a replay with two different objects there would pass the wrong one
                    self._known[id(a)] = ("a", i)
        self._outs, self._consts, self._derived, self._views, self._launches, self._stream = [], [], [], [], [], None

    def forget(self) -> None:
        """This call must not become a plan (an out= argument, a converted input, a data-dependent choice...)."""
        self.ok = False

    def empty(self, shape, dtype, device):
        """A new output or scratch tensor (torch.empty), allocated again by every replay."""
        from rocjit.ops import _common as C
        t = C.torch().empty(tuple(shape), dtype=dtype, device=device)
        if self.ok:
            self._known[id(t)] = ("o", len(self._outs))
            self._outs.append((t, tuple(int(s) for s in t.shape)))
        return t

    def const(self, obj):
        """A tensor the plan keeps and passes as it is (a dummy pointer, a persistent buffer)."""
        if self.ok and id(obj) not in self._known:
            self._known[id(obj)] = ("c", len(self._consts))
            self._consts.append(obj)
        return obj

    def derive(self, fn, tensor):
        """fn(tensor.data_ptr()): a launch argument that follows a tensor argument's address (e.g. a TMA tensor map
        of it, encoded for that address). A replay calls fn again with its own tensor's address, so fn must
        depend on nothing else the plan's key does not fix. Of any other tensor (an output, a copy), no plan."""
        value = fn(tensor.data_ptr())
        if self.ok:
            r = self._known.get(id(tensor))         # an argument, or a view of one at its address (alias)
            if r is None or r[0] not in "av" or id(value) in self._known or len(self._derived) == MAX_DERIVED:
                self.ok = False
            else:
                self._known[id(value)] = ("d", len(self._derived))
                self._derived.append((fn, r[1], value))      # the value kept alive: its id stays its own
        return value

    def alias(self, view, tensor):
        """view: a tensor over `tensor`'s memory from its first element on (its transpose, a uint8 view...), handed
        to kernels as a pointer. A replay passes its own argument's data pointer there; the key fixes the argument's
        dtype, shape and strides, so the view's layout is the one this call checked. Of anything but an argument (or
        a view not at its address), no plan."""
        if self.ok:
            r = self._known.get(id(tensor))
            if r is None or r[0] not in "av" or view.data_ptr() != tensor.data_ptr():
                self.ok = False
            elif id(view) not in self._known:
                self._known[id(view)] = ("v", r[1])
        return view

    def view(self, fn, output):
        """fn(output): a result that is a view of an output (e.g. torch.Tensor.t), which a replay makes again with
        fn from its own output. Of anything but an output, no plan."""
        value = fn(output)
        if self.ok:
            r = self._known.get(id(output))
            if r is None or r[0] != "o" or len(self._views) == MAX_VIEWS:
                self.ok = False
            else:
                self._known[id(value)] = ("w", len(self._views))
                self._views.append((fn, r[1], value))        # the value kept alive: its id stays its own
        return value

    def bind_stream(self) -> None:
        """The plan's constants belong to the current stream: replay it on that stream only."""
        if self.ok:
            tm = sys.modules["torch"]
            dev = next((a.device for a in self.args if isinstance(a, tm.Tensor)), None)
            self._stream = tm.cuda.current_stream(dev).cuda_stream if dev is not None else None
            if dev is None:
                self.ok = False

    def launch(self, kernel, grid, block, *args, shared_mem: int = 0):
        """kernel[grid, block](*args, shared_mem=...), recorded."""
        kernel[grid, block](*args, shared_mem=shared_mem)
        if self.ok:
            refs = [self._ref(a) for a in args]
            if any(r is not None and r[0] == "w" for r in refs):
                self.ok = False                     # result views are made after the launches
            if self.ok:
                self._launches.append((kernel[grid, block], refs, int(shared_mem), kernel))

    def _ref(self, a):
        if a is None:
            return None
        r = self._known.get(id(a))
        if r is not None:
            return list(r)
        t = type(a)
        if t is int or t is bool or t is float:     # fixed by the key (floats forwarded by role S are known)
            self._consts.append(a)
            return ["c", len(self._consts) - 1]
        self.ok = False                             # an unknown tensor (a copy, a view): no plan
        return None

    def done(self, result):
        """The op's return value; the call becomes a plan if everything about it was recorded."""
        if not self.ok or self.op is None:
            return result
        tm = sys.modules.get("torch")
        if tm is None or not self._launches or tm.cuda.is_available() and tm.cuda.is_current_stream_capturing():
            return result       # a graph capture's choices (shipped defaults, no tuning) are not remembered
        items = result if type(result) is tuple else (result,)
        refs = []
        for r in items:
            ref = self._ref(r) if r is not None else None
            if not self.ok or (r is not None and ref[0] in "cv"):
                return result
            refs.append(tuple(ref) if ref is not None else None)
        makers = [_maker(t.dtype, t.device) for t, _ in self._outs]
        outputs = [(shape, make) for (_, shape), (make, _) in zip(self._outs, makers)]
        provisional = not all(kept for _, kept in makers)
        group = _group(self._outs) if outputs and not provisional else None
        launches = [(fn, [tuple(r) if r is not None else None for r in refs_], sm)
                    for fn, refs_, sm, _ in self._launches]
        self.op.last_plan = [(k.name, sum(p.pointer for p in k.params), sum(not p.pointer for p in k.params))
                             for *_, k in self._launches]
        self.op.last_outputs = [(t.dtype, shape) for t, shape in self._outs]
        _activate(self.op)
        if self.op.plans is not None:
            self.op.plans.add(tuple(self.args), outputs, list(self._consts), launches, refs,
                              type(result) is tuple, self._stream, group, [(fn, i) for fn, i, _ in self._derived],
                              [(fn, j) for fn, j, _ in self._views])
            if provisional:
                from rocjit import native
                if not native.torch_alloc_building():
                    self.op.clear_plans()        # the allocator was loaded while this call ran: record again
        return result


UNRECORDED = Call(None)


_MAKERS: dict = {}


def _maker(dtype, device):
    """(make, kept): make(*sizes) -> a new torch tensor of this dtype on this device, for a plan's outputs where
    the native launcher takes no Outputs group (see _group): rocjit's torch allocator (rocjit.native.torch_alloc:
    at::empty without torch's Python argument parsing), else the new_empty of a kept empty prototype (0.4 µs less
    than torch.empty with dtype= and device=). While the allocator is still being built, new_empty stands in and is not
    kept; the plans recorded with it are dropped when the build is loaded (they record again at their next call)."""
    made = _MAKERS.get((dtype, device))
    if made is not None:
        return made, True
    from rocjit import native
    proto = _prototype(dtype, device)
    mod = native.torch_alloc(wait=False)
    if mod is None and native.torch_alloc_building():
        native.on_torch_alloc(clear_plans)       # called once the build is loaded (at once if it already is)
        return proto.new_empty, False            # not kept: the allocator's maker replaces it
    made = mod.Empty(proto) if mod is not None else proto.new_empty
    _MAKERS[(dtype, device)] = made
    return made, True


# The outputs of one call that together need at most this many bytes are carved out of one torch allocation
# (rocjit.native's Outputs): a decode step's small outputs (FP8 rows and their scales) then cost one round trip
# through torch's caching allocator, not one each. Larger outputs are allocated one by one, so that keeping one of
# them alive never keeps the others' memory.
SHARE_LIMIT = 1 << 20


def _group(outs):
    """The torch allocator's Outputs for a plan's outputs [(tensor, shape)], or None (no allocator, or the
    native launcher does not take it). The plans call it from C, which hands back every output's data pointer:
    no Python call and no DLPack query per output, and blocks straight from the allocator at::empty uses (without
    its dispatcher and device guard: 2.3 µs -> 0.9 µs per allocate + free, measured in C++ on an H100 host)."""
    from rocjit import native
    mod = native.torch_alloc(wait=False)
    if mod is None or not native.allocator_registered():
        return None
    protos = [(_prototype(t.dtype, t.device), shape) for t, shape in outs]
    return mod.Outputs(protos, share_limit=SHARE_LIMIT)


_PROTOTYPES: dict = {}


def _prototype(dtype, device):
    p = _PROTOTYPES.get((dtype, device))
    if p is None:
        p = _PROTOTYPES[(dtype, device)] = sys.modules["torch"].empty(0, dtype=dtype, device=device)
    return p


# ----------------------------------------------------------------------------- the registry's readers
def load_all() -> dict[str, Op]:
    """Import every op module of the package (each registers its ops) and return the registry."""
    import importlib
    import pkgutil
    import rocjit.ops as pkg
    for m in pkgutil.iter_modules(pkg.__path__):
        if not m.name.startswith("_"):
            importlib.import_module(f"rocjit.ops.{m.name}")
    return REGISTRY


def register_custom_ops() -> None:
    """Register every torch.ops.rocjit.* op now (torch.compile cannot register one while it traces)."""
    for entry in load_all().values():
        if entry.custom_op is not None:
            entry.torch_op()
            entry.state.compiling = sys.modules["torch"].compiler.is_compiling


def clear_plans() -> None:
    """Forget every recorded eager plan (e.g. after changing ROCJIT_AUTOTUNE or the tuning file)."""
    for entry in REGISTRY.values():
        entry.clear_plans()


def kernel_sources() -> list[str]:
    """Every kernels_src file an op compiles."""
    return sorted({s for e in load_all().values() for s in e.sources})
