"""A FAKE ``pycuda.driver`` (NOT pycuda): the driver-API objects jetson.cuda.PycudaRuntime uses, over host
memory, for unit tests.

Mirrors pycuda v2026.1, ``src/wrapper/wrap_cudadrv.cpp`` (the Boost.Python module ``_driver`` that
``pycuda.driver`` re-exports). What that file binds, for the names used here (:data:`REAL_SURFACE`):

* module functions ``init(flags=0)``, ``get_version()`` (the CUDA pycuda was built against, a tuple),
  ``get_driver_version()`` (an int), ``mem_alloc(bytes)`` (a ``DeviceAllocation``: ``__int__``, ``free``),
  ``memcpy_htod(dest, src)``, ``memcpy_dtoh(dest, src)``; the exception ``Error``;
* ``Device(n)``: ``count()`` (static), ``name``, ``compute_capability``, ``total_memory``,
  ``get_attribute``, ``retain_primary_context``; ``Context``: ``push``, ``pop`` (static), ``synchronize``;
* ``Stream(flags=0)``: ``synchronize``, ``is_done``, ``wait_for_event`` and the property ``handle``;
* ``Event(flags=None)``: ``record(stream=None)``, ``synchronize``, ``query``, ``time_since``, ``time_till``,
  ``ipc_handle`` -- and **no** ``handle`` (only ``Stream`` and ``Function`` have one). A fake that gave
  ``Event`` a handle once hid a crash of the real binding (issue 29, D1).

The context stack (pycuda's ``src/cpp/cuda.hpp``, ``context_stack`` and ``context_push``, ~880-910 at v2026.1):
``Context.push`` pushes onto a stack, ``Context.pop`` pops it, and when the process ends with a context still on
the stack, ``context_stack::~context_stack`` prints "PyCUDA ERROR: The context stack was not empty upon module
cleanup." (and its explanation) on stderr and calls ``abort()``: the process ends by SIGABRT (exit status 134 in
a shell), whatever it wrote before. That is why ``pycuda/autoinit.py`` registers an ``atexit`` handler that pops
the context it pushed. The fake checks its stack in an ``atexit`` handler registered when it is made (so it runs
after any handler registered later, as module cleanup comes after them).

``tests/jetson/test_fakes_surface.py`` checks this fake against the real pycuda where it installs, and
against :data:`REAL_SURFACE` (these facts) everywhere.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import types

#: names wrap_cudadrv.cpp (pycuda v2026.1) binds on each class the fake mimics; ``absent``: names it does not bind
REAL_SURFACE = {
    "Stream": {"present": ("synchronize", "is_done", "wait_for_event", "handle"), "absent": ()},
    "Event": {"present": ("record", "synchronize", "query", "time_since", "time_till"), "absent": ("handle",)},
    "Device": {"present": ("count", "name", "compute_capability", "total_memory", "get_attribute",
                           "retain_primary_context"), "absent": ()},
    "module": {"present": ("init", "get_version", "get_driver_version", "mem_alloc", "memcpy_htod",
                           "memcpy_dtoh", "Error", "Device", "Stream", "Event", "device_attribute"), "absent": ()},
}


def fake_pycuda_driver(devices: int = 1) -> types.ModuleType:
    """A fresh fake ``pycuda.driver`` with ``devices`` GPUs; ``driver.clock[0]`` is the fake GPU clock (ms)."""
    driver = types.ModuleType("pycuda.driver")
    driver.FAKE = True

    class Error(Exception):
        pass

    driver.Error = Error
    driver.device_attribute = types.SimpleNamespace(MULTIPROCESSOR_COUNT="MULTIPROCESSOR_COUNT")
    driver.memory = {}
    driver.clock = [0.0]
    driver.pushed = False  # a context is on the stack
    driver.context_stack = []
    driver.init = lambda flags=0: None
    driver.get_version = lambda: (12, 6, 0)
    driver.get_driver_version = lambda: 12080

    class Context:
        def push(self):
            driver.context_stack.append(self)
            driver.pushed = True

        @staticmethod
        def pop():
            if not driver.context_stack:  # cuda.hpp's context::pop: "cannot pop non-current context"
                raise Error("context::pop failed: cannot pop non-current context")
            driver.context_stack.pop()
            driver.pushed = bool(driver.context_stack)

        def synchronize(self):
            pass

    class Device:
        def __init__(self, index):
            if index >= devices:
                raise Error("cuDeviceGet failed: invalid device ordinal")
            self.index = index

        @staticmethod
        def count():
            return devices

        def retain_primary_context(self):
            return Context()

        name = staticmethod(lambda: "Orin")
        compute_capability = staticmethod(lambda: (8, 7))
        get_attribute = staticmethod(lambda attribute: 8)
        total_memory = staticmethod(lambda: 7620 << 20)

    class DeviceAllocation:
        def __init__(self, nbytes):
            self.buffer = ctypes.create_string_buffer(nbytes)
            driver.memory[int(self)] = self

        def __int__(self):
            return ctypes.addressof(self.buffer)

        def free(self):
            driver.memory.pop(int(self))

    def memcpy_htod(dest, src):
        ctypes.memmove(int(dest), bytes(src), len(src))

    def memcpy_dtoh(dest, src):
        ctypes.memmove(ctypes.addressof(dest), int(src), len(dest))

    class Stream:
        count = 0

        def __init__(self, flags=0):
            Stream.count += 1
            self.handle = 0x100 * Stream.count

        def synchronize(self):
            pass

        def is_done(self):
            return True

        def wait_for_event(self, event):
            pass

    class Event:  # no `handle`: pycuda's Event has none
        def __init__(self, flags=None):
            self._at = None

        def record(self, stream=None):
            self._at = driver.clock[0]
            return self

        def synchronize(self):
            return self

        def query(self):
            return True

        def time_since(self, event):
            if self._at is None or event._at is None:
                raise Error("cuEventElapsedTime failed: device not ready")
            return self._at - event._at

        def time_till(self, event):
            return event.time_since(self)

    driver.Device, driver.mem_alloc, driver.Stream, driver.Event = Device, DeviceAllocation, Stream, Event
    driver.memcpy_htod, driver.memcpy_dtoh = memcpy_htod, memcpy_dtoh
    atexit.register(_context_stack_cleanup, driver)
    return driver


def _context_stack_cleanup(driver: types.ModuleType) -> None:
    """cuda.hpp's ``context_stack::~context_stack``: a context left on the stack aborts the process."""
    if driver.context_stack:
        print("-------------------------------------------------------------------\n"
              "PyCUDA ERROR: The context stack was not empty upon module cleanup.\n"
              "-------------------------------------------------------------------\n"
              "(FAKE pycuda: the real one explains, then calls abort())", file=sys.stderr, flush=True)
        os.abort()


def install_fake_pycuda(monkeypatch, devices: int = 1) -> types.ModuleType:
    """The fake as ``pycuda`` / ``pycuda.driver`` in ``sys.modules`` (through pytest's monkeypatch)."""
    import sys

    driver = fake_pycuda_driver(devices)
    package = types.ModuleType("pycuda")
    package.driver = driver
    monkeypatch.setitem(sys.modules, "pycuda", package)
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
    return driver
