"""A host-memory stand-in for a vendor backend: 'device' buffers are host buffers and a launch runs a Python
emulation of the kernel over the packed parameter block, so argument packing and staging are tested on a CPU.
It implements the whole rocjit.platform.Platform protocol (tests/test_platform_protocol.py checks)."""
import ctypes

NAME = "fake"


class FakePlatform:
    NAME = "fake"
    DLPACK_DEVICE_TYPE = 1      # kDLCPU: CPU torch tensors play GPU ones

    def __init__(self, emulate):
        self.emulate = emulate
        self.buffers, self.launches, self.freed, self.loaded = {}, [], [], []

    def is_available(self):
        return True

    def unavailable_reason(self):
        return ""

    def device_count(self):
        return 1

    def device_name(self, dev):
        return "fake GPU"

    def device_target(self, dev):
        return "sm_90a"

    def device_attributes(self, dev):
        return {"max_shared_per_block_optin": 232448}

    def load(self, code, dev, recompile):
        self.loaded.append(code)
        return 1

    def get_function(self, module, mangled):
        self.mangled = mangled
        return 2

    def function_handle(self, fn):
        return fn

    def function_info(self, fn):
        return {"num_regs": 0, "shared_bytes": 0, "local_bytes": 0, "max_threads": 1024}

    def set_max_dynamic_shared(self, fn, nbytes):
        self.max_shared = nbytes

    def context_handle(self, dev):
        return 0xC0

    def push_current(self, dev):
        return False

    def pop_current(self):
        pass

    def fast_launch(self):
        return None

    def native_launch(self, pdl=False):
        return None

    def malloc(self, nbytes, dev):
        buf = ctypes.create_string_buffer(nbytes)
        self.buffers[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def free(self, ptr):
        self.freed.append(ptr)

    def memcpy_htod(self, dst, src_ptr, nbytes):
        ctypes.memmove(dst, src_ptr, nbytes)

    def memcpy_dtoh(self, dst_ptr, src, nbytes):
        ctypes.memmove(dst_ptr, src, nbytes)

    def synchronize(self, dev):
        pass

    def pointer_device(self, ptr):
        return 0 if ptr in self.buffers else None

    def check_last(self, dev):
        pass

    def error_name(self, code):
        return f"FAKE_ERROR_{code}"

    def launch(self, fn, grid, block, shared_mem, stream, kernel_params):
        self.launches.append((grid, block, shared_mem, stream))
        return self.emulate(kernel_params)


def param(params, i, ctype):
    """Value of parameter i of the packed block."""
    return ctype.from_address(params[i]).value
