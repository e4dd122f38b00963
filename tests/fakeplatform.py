"""A host-memory stand-in for a vendor backend: 'device' buffers are host buffers and a launch runs a Python
emulation of the kernel over the packed parameter block, so argument packing and staging are tested on a CPU."""
import ctypes

from rocjit.platform import Compiled

NAME = "fake"


class FakePlatform:
    NAME = "fake"

    def __init__(self, emulate, layout=None):
        self.emulate, self.layout = emulate, layout
        self.buffers, self.launches, self.freed = {}, [], []

    def is_available(self):
        return True

    def device_count(self):
        return 1

    def device_target(self, dev):
        return "sm_90a"

    def device_attributes(self, dev):
        return {"max_shared_per_block_optin": 232448}

    def load_module(self, binary, dev):
        return 1

    def get_function(self, module, mangled):
        self.mangled = mangled
        return 2

    def param_layout(self, binary, module, fn, mangled, count=None):
        return self.layout

    def set_current(self, dev):
        pass

    def set_max_dynamic_shared(self, fn, n):
        self.max_shared = n

    def malloc(self, n, dev):
        buf = ctypes.create_string_buffer(n)
        self.buffers[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def free(self, ptr):
        self.freed.append(ptr)

    def memcpy_htod(self, dst, src, n):
        ctypes.memmove(dst, src, n)

    def memcpy_dtoh(self, dst, src, n):
        ctypes.memmove(dst, src, n)

    def pointer_device(self, ptr):
        return 0 if ptr in self.buffers else None

    def check_last(self, dev):
        pass

    def error_name(self, code):
        return f"FAKE_ERROR_{code}"

    def launch(self, fn, grid, block, shared_mem, stream, params):
        self.launches.append((grid, block, shared_mem, stream))
        return self.emulate(params)


def param(params, i, ctype):
    """Value of parameter i of the packed block."""
    return ctype.from_address(params[i]).value
