"""The CUDA runtime's copy and event calls, through ctypes, from the library torch loaded.

``transport.torch`` moves a step's records with these instead of ``Tensor.copy_``: a strided
copy (``cudaMemcpy2DAsync``) takes one field of every env's slot straight into a contiguous
device tensor (the DMA engine skips the rest of each slot: no slot block, no gather kernel), and
a plain ``cudaMemcpyAsync`` costs ~1 us of host time where ``copy_`` costs several. The library
is the one already mapped into the process (``/proc/self/maps``): the same runtime, context and
streams as torch's. Where it cannot be found (a static build, another OS) ``load()`` returns
None and the caller keeps torch's own copies. Nothing here imports torch.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transport.errors import AdapterError

__all__ = ["CudaError", "CudaRuntime", "StridedCopy", "load", "runtime_path"]

HOST_TO_DEVICE = 1
"""``cudaMemcpyHostToDevice``."""
DEVICE_TO_HOST = 2
"""``cudaMemcpyDeviceToHost``."""
DEVICE_TO_DEVICE = 3
"""``cudaMemcpyDeviceToDevice``."""
EVENT_DISABLE_TIMING = 2
"""``cudaEventDisableTiming``: an event that only orders, the cheapest kind to record."""


@dataclass(frozen=True)
class StridedCopy:
    """Some bytes of ``rows`` records: ``width`` bytes at ``source`` every ``pitch`` bytes (a
    slot's stride), to ``target`` every ``target_pitch`` bytes (0: ``width``, contiguous)."""

    target: int
    source: int
    pitch: int
    width: int
    rows: int
    target_pitch: int = 0


def runtime_path(maps: str | None = None) -> str | None:
    """The path of the CUDA runtime (``libcudart.so*``) mapped into this process, or None."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return None
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and Path(parts[5]).name.startswith("libcudart.so"):
            return parts[5]
    return None


class CudaRuntime:
    """The few runtime calls a staging path needs, each checked: a failure is a ``CudaError``
    naming the call and the runtime's own message."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._lib = library
        vp, size, i, u = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint
        self._memcpy = self._fn("cudaMemcpyAsync", [vp, vp, size, i, vp])
        self._memcpy2d = self._fn("cudaMemcpy2DAsync", [vp, size, vp, size, size, size, i, vp])
        self._event_create = self._fn("cudaEventCreateWithFlags", [ctypes.POINTER(vp), u])
        self._event_record = self._fn("cudaEventRecord", [vp, vp])
        self._event_sync = self._fn("cudaEventSynchronize", [vp])
        self._event_destroy = self._fn("cudaEventDestroy", [vp])
        self._stream_sync = self._fn("cudaStreamSynchronize", [vp])
        self._error_string = library.cudaGetErrorString
        self._error_string.argtypes = [i]
        self._error_string.restype = ctypes.c_char_p

    def _fn(self, name: str, argtypes: list[Any]) -> Any:
        fn = getattr(self._lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
        return fn

    def _check(self, rc: int, call: str) -> None:
        if rc != 0:
            text = self._error_string(rc)
            message = text.decode(errors="replace") if text else "unknown error"
            raise CudaError(f"{call} failed: {message} (cudaError {rc})")

    def copy(self, target: int, source: int, nbytes: int, stream: int) -> None:
        """``nbytes`` from host ``source`` to device ``target``, queued on ``stream``."""
        self._check(self._memcpy(target, source, nbytes, HOST_TO_DEVICE, stream), "cudaMemcpyAsync")

    def copy_to_host(self, target: int, source: int, nbytes: int, stream: int) -> None:
        """``nbytes`` from device ``source`` to (pinned) host ``target``, queued on ``stream``."""
        rc = self._memcpy(target, source, nbytes, DEVICE_TO_HOST, stream)
        self._check(rc, "cudaMemcpyAsync")

    def copy_on_device(self, target: int, source: int, nbytes: int, stream: int) -> None:
        """``nbytes`` from device ``source`` to device ``target``, queued on ``stream``."""
        rc = self._memcpy(target, source, nbytes, DEVICE_TO_DEVICE, stream)
        self._check(rc, "cudaMemcpyAsync")

    def synchronize_stream(self, stream: int) -> None:
        """Wait (the GIL released) until the work queued on ``stream`` has run."""
        self._check(self._stream_sync(stream), "cudaStreamSynchronize")

    def copy_strided(self, plan: StridedCopy, stream: int) -> None:
        """Some bytes of every record to the device, queued on ``stream``."""
        rc = self._memcpy2d(
            plan.target, plan.target_pitch or plan.width, plan.source, plan.pitch, plan.width,
            plan.rows,
            HOST_TO_DEVICE, stream,
        )  # fmt: skip
        self._check(rc, "cudaMemcpy2DAsync")

    def event(self) -> int:
        """A new event on the current device (timing off)."""
        handle = ctypes.c_void_p()
        self._check(
            self._event_create(ctypes.byref(handle), EVENT_DISABLE_TIMING),
            "cudaEventCreateWithFlags",
        )
        return int(handle.value or 0)

    def record(self, event: int, stream: int) -> None:
        self._check(self._event_record(event, stream), "cudaEventRecord")

    def synchronize(self, event: int) -> None:
        """Wait (the GIL released) until the work before the event's record has run."""
        self._check(self._event_sync(event), "cudaEventSynchronize")

    def destroy(self, event: int) -> None:
        self._check(self._event_destroy(event), "cudaEventDestroy")


class CudaError(AdapterError):
    """A CUDA runtime call failed (the staging path of ``transport.torch``)."""


def load(maps: str | None = None) -> CudaRuntime | None:
    """The runtime torch loaded, or None where it is not a shared library in this process (or
    lacks a call used here): the caller then keeps torch's own copies."""
    path = runtime_path(maps)
    if path is None:
        return None
    try:
        return CudaRuntime(ctypes.CDLL(path))
    except (OSError, AttributeError):
        return None
