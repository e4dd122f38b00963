"""Module / Kernel: compile on first use per target, load per device, ``kernel[grid, block]`` -> a launcher.

Launching lives in rocjit.launch: one ParamSpec per target (the parsed signature checked against the code
object), the general path that checks every argument, and the fast launchers built from the same spec.
"""
from __future__ import annotations

import os
import re
import sys
import threading

from rocjit import codeobject, compiler, signature, targets
from rocjit.launch import fast, general
from rocjit.launch.params import ParamSpec


_PDL_DIRECTIVE = re.compile(r"^[ \t]*//[ \t]*rocjit:pdl[ \t]*$", re.M)


class Module:
    """A HIP source (string or file) whose kernels compile on first use; ``mod["name<args>"]`` gives a Kernel.

    pdl: the kernels are launched with programmatic dependent launch where the device has it (NVIDIA sm_90+, native
    launcher): each may start while the kernel ahead of it in the stream finishes, so each must call
    ``rocjit::grid_dependency_wait()`` (rocjit/stream.h) in every thread before it reads memory an earlier kernel
    writes or writes memory an earlier kernel reads. None (default): as the source says, by a line
    ``// rocjit:pdl``. ROCJIT_PDL=0 turns it off everywhere (the same results, no overlap)."""

    def __init__(self, source_or_path, *, defines=None, options=None, include_dirs=(), pdl=None):
        self.source, self.filename, self.source_dir = compiler.read_source(source_or_path)
        self.defines, self.options, self.include_dirs = dict(defines or {}), list(options or ()), tuple(include_dirs)
        self.pdl = bool(_PDL_DIRECTIVE.search(self.source)) if pdl is None else bool(pdl)
        self._kernels: dict[str, Kernel] = {}

    def __getitem__(self, name_expression: str) -> "Kernel":
        k = self._kernels.get(name_expression)
        if k is None:
            k = self._kernels[name_expression] = Kernel(self, name_expression)
        return k

    def compile(self, target: str, name_expressions=()):
        """Compile for a named target without a GPU (used by ``check`` and tests)."""
        return compiler.compile_text(self.source, target, filename=self.filename, source_dir=self.source_dir,
                                     defines=self.defines, options=self.options,
                                     name_expressions=name_expressions, include_dirs=self.include_dirs)

    def kernel_names(self):
        """Kernel names as name expressions (namespace-qualified), each once."""
        return list(dict.fromkeys("::".join((*ns, k)) for ns, k, _, _ in signature.find_kernels(self.source)))


def kernel(source_or_path, name: str | None = None, *, defines=None, options=None, include_dirs=()) -> "Kernel":
    """One kernel from a source: `name` may be a template name expression; omitted, the source's only kernel."""
    mod = Module(source_or_path, defines=defines, options=options, include_dirs=include_dirs)
    if name is None:
        names = mod.kernel_names()
        if len(names) != 1:
            raise ValueError(f"the source defines {len(names)} __global__ kernels ({', '.join(names) or 'none'}); "
                             f"pass name=... to choose one")
        name = names[0]
    return mod[name]


class Kernel:
    def __init__(self, module: Module, name_expression: str):
        self.module, self.name = module, name_expression
        self.params = signature.parse(module.source, name_expression, defines=module.defines)
        if self.params is None:
            raise ValueError(f"no __global__ kernel named {name_expression.split('<')[0]!r} in {module.filename}")
        self._plat = None
        self._code = {}                 # target -> CodeObject
        self._specs: dict[str, ParamSpec] = {}
        self._fns: dict = {}            # device -> function handle
        self._dev_specs: dict[int, ParamSpec] = {}
        self.shared_limit: dict[int, int] = {}     # device -> dynamic shared memory a launch may use as it is
        self.static_shared: dict[int, int] = {}    # device -> the function's static shared memory
        self._configured = {}
        self._fast_path = None          # None: not built yet; False: the general path does every launch
        self._owner = threading.get_ident()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ compile / load
    def compile(self, target: str):
        co = self._code.get(target)
        if co is None:
            co = self._code[target] = self.module.compile(target, (self.name,))
        return co

    def param_spec(self, target: str) -> ParamSpec:
        """The parameters as declared, checked against `target`'s code object (no GPU needed)."""
        spec = self._specs.get(target)
        if spec is None:
            co = self.compile(target)
            layout = codeobject.param_layout(co.binary, co.lowered.get(self.name, self.name))
            spec = self._specs[target] = ParamSpec.build(self.name, self.params, layout)
        return spec

    def programmatic_launch(self, target: str) -> bool:
        """Whether launches of this kernel on `target` overlap the kernel ahead of them (see Module's pdl)."""
        return (self.module.pdl and os.environ.get("ROCJIT_PDL", "") != "0"
                and targets.has_programmatic_launch(target))

    def platform(self):
        if self._plat is None:
            from rocjit import platform
            self._plat = platform.get()
        return self._plat

    @property
    def code_object(self):
        """The code object for the current platform's device 0 target (compiled if needed)."""
        return self.compile(self.platform().device_target(self.default_device()))

    @property
    def mangled_name(self) -> str:
        return self.code_object.lowered.get(self.name, self.name)

    def loaded(self, dev: int):
        """(function, ParamSpec) of this kernel on `dev`, loading it there first if needed."""
        fn = self._fns.get(dev)
        if fn is None:
            fn = self._load(dev)
        return fn, self._dev_specs[dev]

    def _load(self, dev: int):
        plat = self.platform()
        target = plat.device_target(dev)
        spec = self.param_spec(target)      # a signature the code object contradicts fails here, before loading
        co = self.compile(target)
        with general.device_context(plat, dev):
            mod = _load_module(plat, co, dev, self.compile)
            fn = plat.get_function(mod, co.lowered.get(self.name, self.name))
            try:
                static = int(plat.function_info(fn).get("shared_bytes") or 0)
            except Exception:       # a runtime that cannot say: the launch itself reports a refused size
                static = 0
        with self._lock:
            self._dev_specs[dev] = spec
            self._fns[dev] = fn
            # static + dynamic shared memory above 48 KB needs the function's opt-in attribute: a launch whose
            # dynamic bytes exceed what is left of 48 KB beside the static ones sets it first
            self.static_shared[dev] = static
            self.shared_limit[dev] = max(0, general.STATIC_SHARED_LIMIT - static)
            if self._fast_path is None:
                self._fast_path = fast.build(self, plat, spec, target) or False
                self._configured.clear()   # later kernel[grid, block] lookups hand out generated launchers
            elif self._fast_path and spec is self._fast_spec_of():
                self._fast_path.add_device(plat, dev, fn)
        return fn

    def _fast_spec_of(self):
        """The spec the fast path was built for (a device of another target stays on the general path)."""
        return next(iter(self._dev_specs.values()))

    # the fast path's pieces, for tests and tools
    @property
    def _fast(self):
        return self._fast_path.make if self._fast_path else self._fast_path

    @property
    def _fast_fns(self):
        return self._fast_path.fns if self._fast_path else None

    @property
    def _native(self):
        return self._fast_path.native_spec if self._fast_path else None

    @property
    def _fast_source(self):
        return self._fast_path.source if self._fast_path else None

    # ------------------------------------------------------------------ launch syntax
    def __getitem__(self, cfg):
        try:
            return self._configured[cfg]
        except (KeyError, TypeError):   # TypeError: an unhashable grid such as a list
            pass
        if not (isinstance(cfg, tuple) and len(cfg) == 2):
            raise TypeError("launch with kernel[grid, block](*args): grid and block are ints or tuples")
        g, b = general.dim3(cfg[0], "grid"), general.dim3(cfg[1], "block")
        launcher = self._fast(*g, *b) if self._fast else general.Configured(self, g, b)
        if len(self._configured) < 256:
            try:
                self._configured[cfg] = launcher
            except TypeError:
                pass
        return launcher

    def __call__(self, *args, grid, block, shared_mem: int = 0, stream=None):
        return self[grid, block](*args, shared_mem=shared_mem, stream=stream)

    def default_device(self) -> int:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.current_device()
        return 0

    def __repr__(self):
        return f"<rocjit.Kernel {self.name} from {self.module.filename}>"


_modules: dict[tuple[str, int], object] = {}
_modules_lock = threading.Lock()


def _load_module(plat, co, dev, recompile):
    """Loaded modules are cached per (code object, device)."""
    key = (co.key, dev)
    with _modules_lock:
        mod = _modules.get(key)
        if mod is None:
            mod = _modules[key] = plat.load(co, dev, recompile)
    return mod
