"""Step and reset results as torch tensors (an optional extra: ``pip install torch``).

``transport.torch.connect(url, device=None)`` gives a ``TorchClient``: ``reset`` and ``step``
return a ``TensorStep`` whose fields are torch tensors, and ``step`` takes actions as a tensor
(CPU or CUDA; another device's are copied to the CPU; bfloat16 and float8 are widened to
float32, exactly), a NumPy array or an int. The device is chosen once, at connect time
(``device=None``: CUDA when torch sees it, else the CPU), and the repr says which and why.

- **CPU.** Each field is ``torch.from_numpy`` of the client's zero-copy NumPy view (the shm slots,
  or the stream backends' receive buffer): no byte is copied. A field whose row stride or
  address is not a multiple of its element size (a packed layout such as pac_env's 2557-byte
  wire record over a socket) cannot be a tensor view: it is copied into a tensor of its own
  each step, and ``copied_fields`` names it.
- **Column layout** (``[env] shm = "columns"``): every field of a step is its column, one
  contiguous (N, ...) block of the region: the CPU tensor is ``torch.from_numpy`` of it (its
  ``data_ptr`` is the column's address); on CUDA the result columns (back to back in the
  region) travel in ONE asynchronous copy from the registered region, each field a view of the
  device block (no slot block, no gather).
- **CUDA.** A per-connection staging path: the shm region is registered with CUDA once
  (``cudaHostRegister``: page-locked in place, so the DMA engine reads the slots directly).
  From a registered slot region the records travel in strided copies (``cudaMemcpy2DAsync``:
  some bytes at every slot stride, through ``transport.cudart``): each large field (an
  observation) into a contiguous device tensor of its own, the small fields that lie together
  in one copy of their span. Only the records' bytes move: no slot block, no gather kernel.
  Without the runtime library (``transport.cudart.load()`` is None), and for a stream backend
  (its records copied with one ``memcpy`` into a pinned staging buffer), the block of all the
  step's records is copied asynchronously and every field is a slice of that device block
  (``view(dtype)``, no kernel for aligned fields). Copies go on the current CUDA stream.
  Actions go back through a pinned host buffer (one device-to-host copy of N actions).

Lifetimes: as for ``StepView``, a step's tensors are valid until the next call on the client
(CPU: they view the slots; CUDA: the device block is reused); ``copy=True`` returns owned
tensors. A CPU tensor kept after ``close()`` stays readable: it holds the NumPy view, which
holds the mapping (docs/shm.md, "Lifetimes"). ``close()`` waits for the copies in flight and
unregisters the region from CUDA before the client closes (the shm client then privatizes or
unmaps its pages). The core never imports torch: only this module does.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transport import cudart
from transport.api import connect as _connect
from transport.backends.shm.region import ColumnRecords
from transport.client import DEFAULT_TIMEOUT, Client
from transport.codec import Schema
from transport.errors import ActionError, AdapterError, TransportError
from transport.protocol import DEFAULT_MAX_BODY, AutoReset
from transport.step_view import StepView

_cuda: Any = torch.cuda  # torch's CUDA calls are untyped: called through Any
_raw_stream: Any = getattr(torch._C, "_cuda_getCurrentRawStream", None)
"""The current stream's handle by device index (~0.2 us; ``current_stream`` makes a Stream)."""

__all__ = [
    "TensorStep",
    "TorchClient",
    "choose_device",
    "connect",
    "region_span",
    "torch_dtype",
]

_DTYPES: dict[str, Any] = {
    "b1": torch.bool,
    "u1": torch.uint8,
    "i1": torch.int8,
    "i2": torch.int16,
    "u2": torch.uint16,
    "i4": torch.int32,
    "u4": torch.uint32,
    "i8": torch.int64,
    "u8": torch.uint64,
    "f2": torch.float16,
    "f4": torch.float32,
    "f8": torch.float64,
}
"""NumPy element kinds (kind + itemsize) and the torch dtype of the same bytes."""

_WIDENED: frozenset[Any] = frozenset(
    kind
    for kind in (
        torch.bfloat16,
        *(getattr(torch, name, None) for name in ("float8_e4m3fn", "float8_e5m2")),
        *(getattr(torch, name, None) for name in ("float8_e4m3fnuz", "float8_e5m2fnuz")),
        getattr(torch, "float8_e8m0fnu", None),
    )
    if kind is not None
)
"""Float dtypes NumPy has no type for (an autocast policy's bfloat16, the float8 types): their
actions are widened to float32, which holds every one of their values exactly, and then judged
by the client's action rule as a float16 array is (into a float field they are cast as NumPy
casts, exact where the field's type holds the value; into an integer field refused)."""


def torch_dtype(dtype: np.dtype[Any]) -> Any:
    """The torch dtype whose elements have ``dtype``'s bytes, or None (structs, strings)."""
    if dtype.names is not None or dtype.subdtype is not None or not dtype.isnative:
        return None
    return _DTYPES.get(f"{dtype.kind}{dtype.itemsize}")


def choose_device(device: str | Any | None) -> tuple[Any, str]:
    """``(torch.device, why)``: None or ``"auto"`` is CUDA when available, else the CPU (the
    fallback); an explicit ``"cuda"`` without CUDA is an ``AdapterError``."""
    if device is None or device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device()), "auto"
        return torch.device("cpu"), "CPU fallback: CUDA is not available"
    try:
        chosen = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise AdapterError(f"device {device!r} is not a torch device: {exc}") from None
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            raise AdapterError(
                f"device {device!r} was asked for but torch sees no CUDA device (torch "
                f"{torch.__version__}): pass device=None to fall back to the CPU"
            )
        if chosen.index is None:
            chosen = torch.device("cuda", torch.cuda.current_device())
        return chosen, "asked"
    if chosen.type != "cpu":
        raise AdapterError(f"device {device!r}: only cpu and cuda are supported")
    return chosen, "asked"


def region_span(client: Client) -> tuple[int, int] | None:
    """``(address, size)`` of the shm region a client's results live in (the whole mapping:
    what ``cudaHostRegister`` pins), or None for a stream backend (a receive buffer)."""
    region = getattr(client.channel, "region", None)
    mapping, size = getattr(region, "map", None), getattr(region, "size", None)
    if mapping is None or not isinstance(size, int) or size <= 0:
        return None
    try:
        whole = np.frombuffer(mapping, dtype=np.uint8)
    except (TypeError, ValueError):  # closed: the region's buffer is gone
        return None
    if whole.nbytes < size:
        return None
    return _address(whole), size


class TensorStep:
    """The fields of a step or reset result as torch tensors, by attribute or by key (the
    shapes of ``StepView``'s: a leading env axis for a batch)."""

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self._fields = fields

    def __getattr__(self, name: str) -> Any:
        if name == "_fields" or name.startswith("__"):  # unset (copy, pickle): not a field
            raise AttributeError(name)
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> Any:
        return self._fields[name]

    def __contains__(self, name: object) -> bool:
        return name in self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def keys(self) -> list[str]:
        return list(self._fields)

    def items(self) -> list[tuple[str, Any]]:
        return list(self._fields.items())

    def clone(self) -> TensorStep:
        """Owned copies of every field (kept past the next step)."""
        return TensorStep({name: value.clone() for name, value in self._fields.items()})

    def __repr__(self) -> str:
        first = next(iter(self._fields.values()), None)
        where = "" if first is None else f"; device={first.device}"
        return f"TensorStep({', '.join(self._fields)}{where})"


def _root(array: np.ndarray) -> Any:
    """The object at the end of ``array``'s base chain: the buffer it views."""
    base: Any = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def _viewable(array: np.ndarray) -> bool:
    """Whether ``torch.from_numpy`` can view ``array`` safely: every stride and the address a
    multiple of the element size (a packed record's fields may be neither)."""
    size = array.dtype.itemsize
    return _address(array) % size == 0 and all(s % size == 0 and s >= 0 for s in array.strides)


class _HostPlan:
    """The CPU tensors of one ``StepView`` (the client reuses its views: so do we)."""

    def __init__(self, view: StepView) -> None:
        self.view = view  # held: its id keys the cache
        self.fields: dict[str, Any] = {}
        self.copies: list[tuple[np.ndarray, np.ndarray]] = []  # (source view, owned target)
        self.skipped: list[str] = []
        self.copied: list[str] = []
        for name in view:
            array = view[name]
            if torch_dtype(array.dtype) is None:
                self.skipped.append(name)
                continue
            if _viewable(array):
                self.fields[name] = torch.from_numpy(array)
            else:
                owned = np.empty(array.shape, dtype=array.dtype)
                self.copies.append((array, owned))
                self.copied.append(name)
                self.fields[name] = torch.from_numpy(owned)
        self.step = TensorStep(self.fields)

    def refresh(self, owner: TorchClient) -> TensorStep:
        for source, target in self.copies:
            np.copyto(target, source)
        return self.step


def _record_fields(
    dtype: np.dtype[Any], skipped: list[str]
) -> list[tuple[str, int, int, int, Any, tuple[int, ...]]]:
    """``(name, offset, bytes, element size, torch dtype, shape)`` of each field of a record
    that a tensor can hold; the others' names go to ``skipped``."""
    out = []
    for name in dtype.names or ():
        base, shape = dtype[name].base, dtype[name].shape
        tdtype = torch_dtype(base)
        if tdtype is None:
            skipped.append(name)
            continue
        offset = int(dtype.fields[name][1])  # type: ignore[index]
        width = base.itemsize * int(np.prod(shape, dtype=np.int64))
        out.append((name, offset, width, base.itemsize, tdtype, shape))
    return out


class _DevicePlan:
    """The device tensors of one ``StepView``: the records' block, copied to the device each
    step, and each field as a slice of it."""

    def __init__(self, owner: TorchClient, view: StepView) -> None:
        self.view = view
        records = view.record
        self.count = None if records.ndim == 0 else int(records.shape[0])
        rows = 1 if self.count is None else self.count
        itemsize = records.dtype.itemsize
        # one record: the device rows may be padded at will (64 bytes keeps fields aligned)
        stride = -(-itemsize // 64) * 64 if rows == 1 else int(records.strides[0])
        if stride < itemsize:
            raise AdapterError(f"records of {itemsize} bytes overlap (stride {stride})")
        self.nbytes = (rows - 1) * stride + itemsize
        address = _address(records)
        root = _root(records)
        whole = np.frombuffer(root, dtype=np.uint8)
        start = address - _address(whole)
        self.host = whole[start : start + self.nbytes]  # the records' block, no copy
        device = owner.device
        # the host side of the DMA: the registered region itself, else a pinned staging buffer
        if owner._registered_span(address, self.nbytes):
            self.source = torch.from_numpy(self.host)
            self.stage: np.ndarray | None = None
        else:
            self.source = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=owner.cuda)
            self.stage = self.source.numpy()
        block = torch.empty(rows * stride, dtype=torch.uint8, device=device)
        self.target = block[: self.nbytes]
        grid = block.view(rows, stride)
        self.fields: dict[str, Any] = {}
        self.gathers: list[tuple[Any, Any]] = []  # unaligned fields: (bytes slice, own bytes)
        self.skipped: list[str] = []
        self.copied: list[str] = []  # on the device: a gather kernel per unaligned field
        fields = _record_fields(records.dtype, self.skipped)
        for name, offset, length, size, tdtype, shape in fields:
            raw = grid[:, offset : offset + length]
            if offset % size or stride % size:
                own = torch.empty((rows, length), dtype=torch.uint8, device=device)
                self.gathers.append((raw, own))
                self.copied.append(name)
                raw = own
            tensor = raw.view(tdtype).reshape(rows, *shape)
            self.fields[name] = tensor[0] if self.count is None else tensor
        self.step = TensorStep(self.fields)

    def refresh(self, owner: TorchClient) -> TensorStep:
        """Copy this step's records to the device on the device's current stream: ordered
        after the kernels that read the last step's tensors and before those that read these
        (a side stream bought no overlap and cost two stream waits a step); the event lets the
        next request wait until the DMA has read the slots (``_settle``)."""
        if self.stage is not None:
            np.copyto(self.stage, self.host)  # the stream backends: one memcpy into pinned
        self.target.copy_(self.source, non_blocking=True)
        for raw, own in self.gathers:
            own.copy_(raw)
        owner._mark_copied(None)
        return self.step


OWN_COPY_BYTES = 256
"""A field of at least this many bytes per record gets a strided copy of its own (a contiguous
tensor); smaller fields that lie together travel in one strided copy of their span (a launch
costs ~4 us of host time: as much as ~200 KB of DMA)."""


class _StridedPlan:
    """The device tensors of one ``StepView`` over a registered slot region, copied by strided
    DMAs (``cudaMemcpy2DAsync``: some bytes at every slot stride). Each large field (an
    observation) lands in a contiguous (N, ...) tensor of its own; the small fields that lie
    together in the record (reward, flags, a mask) travel in one copy of their span and are
    views of it. Only the record's bytes move: a slot also holds control words, actions and
    info text. An unaligned field gets a copy of its own, so it lands aligned (no gather)."""

    def __init__(self, owner: TorchClient, view: StepView) -> None:
        self.view = view
        records = view.record
        self.count = None if records.ndim == 0 else int(records.shape[0])
        rows = 1 if self.count is None else self.count
        dtype = records.dtype
        pitch = dtype.itemsize if rows == 1 else int(records.strides[0])
        address = _address(records)
        self.copies: list[cudart.StridedCopy] = []
        self.fields: dict[str, Any] = {}
        self.skipped: list[str] = []
        self.copied: list[str] = []  # nothing is gathered on the device
        runs: list[list[tuple[str, int, int, Any, tuple[int, ...]]]] = []
        """Small aligned fields by offset, grouped while they lie within OWN_COPY_BYTES."""
        fields = sorted(_record_fields(dtype, self.skipped), key=lambda field: field[1])
        for name, offset, width, size, tdtype, shape in fields:
            if width >= OWN_COPY_BYTES or offset % size:  # large, or unaligned in its span
                target = torch.empty((rows, *shape), dtype=tdtype, device=owner.device)
                if width:
                    self.copies.append(
                        cudart.StridedCopy(target.data_ptr(), address + offset, pitch, width, rows)
                    )
                self.fields[name] = target[0] if self.count is None else target
                continue
            if runs and offset - (runs[-1][-1][1] + runs[-1][-1][2]) < OWN_COPY_BYTES:
                runs[-1].append((name, offset, width, tdtype, shape))
            else:
                runs.append([(name, offset, width, tdtype, shape)])
        for run in runs:
            first = run[0][1] - run[0][1] % 8  # 8-byte aligned: every element stays aligned
            span = max(offset + width for _, offset, width, _, _ in run) - first
            row = -(-span // 64) * 64
            block = torch.empty((rows, row), dtype=torch.uint8, device=owner.device)
            self.copies.append(
                cudart.StridedCopy(block.data_ptr(), address + first, pitch, span, rows, row)
            )
            for name, offset, width, tdtype, shape in run:
                at = offset - first
                tensor = block[:, at : at + width].view(tdtype).reshape(rows, *shape)
                self.fields[name] = tensor[0] if self.count is None else tensor
        self.fields = {name: self.fields[name] for name in dtype.names or () if name in self.fields}
        # the largest first: the small copies' launches overlap its DMA
        self.copies.sort(key=lambda copy: -copy.width * copy.rows)
        self.step = TensorStep(self.fields)

    def refresh(self, owner: TorchClient) -> TensorStep:
        """Queue this step's copies on the device's current stream (ordered after the kernels
        that read the last step's tensors, before those that read these)."""
        runtime, stream = owner._runtime, owner._stream()
        assert runtime is not None
        for copy in self.copies:
            runtime.copy_strided(copy, stream)
        owner._mark_copied(stream)
        return self.step


class _ColumnPlan:
    """The device tensors of one ``StepView`` over a column-layout shm region. Each field is
    its column, one contiguous (N, ...) block; the result columns lie back to back in the
    region (each at a multiple of 64 bytes), so from a registered region they all travel in
    ONE asynchronous copy of their span and each field is a view of the device block at its
    column's offset (aligned: no kernel, no gather). A region that could not be registered
    goes through one pinned staging buffer per field (one copy each)."""

    def __init__(self, owner: TorchClient, view: StepView) -> None:
        self.view = view
        self.fields: dict[str, Any] = {}
        self.copies: list[tuple[Any, Any, np.ndarray | None, np.ndarray | None]] = []
        """(device target, host source, pinned stage or None, the column view or None)."""
        self.span: tuple[int, int, int] | None = None
        """(device address, host address, bytes): the one runtime copy of the result columns."""
        self.skipped: list[str] = []
        self.copied: list[str] = []  # nothing is gathered: every column is one block
        arrays: dict[str, tuple[np.ndarray, Any]] = {}
        for name in view:
            array = view[name]
            tdtype = torch_dtype(array.dtype)
            if tdtype is None:
                self.skipped.append(name)
            else:
                arrays[name] = (array, tdtype)
        if not arrays:
            self.step = TensorStep(self.fields)
            return
        lo = min(_address(a) for a, _ in arrays.values())
        hi = max(_address(a) + a.nbytes for a, _ in arrays.values())
        aligned = all((_address(a) - lo) % a.dtype.itemsize == 0 for a, _ in arrays.values())
        if aligned and owner._registered_span(lo, hi - lo):
            first = next(iter(arrays.values()))[0]
            whole = np.frombuffer(_root(first), dtype=np.uint8)
            start = lo - _address(whole)
            source = torch.from_numpy(whole[start : start + hi - lo])  # the region itself
            block = torch.empty(hi - lo, dtype=torch.uint8, device=owner.device)
            self.copies.append((block, source, None, None))
            if owner._runtime is not None:
                self.span = (block.data_ptr(), lo, hi - lo)
            for name, (array, tdtype) in arrays.items():
                at = _address(array) - lo
                raw = block[at : at + array.nbytes]
                self.fields[name] = raw.view(tdtype).reshape(array.shape)
        else:
            for name, (array, tdtype) in arrays.items():
                target = torch.empty(array.shape, dtype=tdtype, device=owner.device)
                staged = torch.empty(array.shape, dtype=tdtype, pin_memory=owner.cuda)
                self.copies.append((target, staged, staged.numpy(), array))
                self.fields[name] = target
        self.step = TensorStep(self.fields)

    def refresh(self, owner: TorchClient) -> TensorStep:
        """Copy this step's columns to the device, on the device's current stream: ordered
        after the kernels that read the last step's tensors and before those that read these
        (no side stream to synchronise with: one DMA, nothing to overlap); the event lets the
        next request wait until the DMA has read the region (``_settle``)."""
        if self.span is not None and owner._runtime is not None:
            stream = owner._stream()
            owner._runtime.copy(*self.span, stream)  # ~1 us of host time; copy_ costs several
            owner._mark_copied(stream)
            return self.step
        for _, _, stage, array in self.copies:
            if stage is not None and array is not None:
                np.copyto(stage, array)
        for target, source, _, _ in self.copies:
            target.copy_(source, non_blocking=True)
        owner._mark_copied(None)
        return self.step


class TorchClient:
    """A ``Client`` whose results are torch tensors on ``device`` (see the module docstring).

    Wraps ``client`` (and closes it). ``device``: None / ``"auto"`` (CUDA if available, else
    the CPU fallback), ``"cpu"``, ``"cuda"`` or ``"cuda:K"``.
    """

    def __init__(self, client: Client, device: str | Any | None = None) -> None:
        self.client = client
        self.device, self.device_reason = choose_device(device)
        self.cuda = self.device.type == "cuda"
        self._plans: dict[int, Any] = {}
        self._copied_names: set[str] | None = None  # copied fields of the results seen so far
        self._pending = False
        self._closed = False
        self._registered: tuple[int, int] | None = None
        self._actions_host: Any = None
        self._actions_array: np.ndarray | None = None  # the pinned actions' NumPy view
        self._runtime: cudart.CudaRuntime | None = None
        """The CUDA runtime's copy calls (strided and ~1 us ones), None: torch's copies."""
        self._event = 0  # the runtime's event for the copies of the last result
        self.view: StepView | None = None
        """The client's NumPy view of the last result (the CPU tensors view its arrays)."""
        self.path = "zero-copy views" if not self.cuda else "pinned staging buffer"
        if self.cuda:
            self._copied = _cuda.Event()
            self._acted = _cuda.Event()
            self._register()
            if self._registered is not None:
                self._load_runtime()

    # -- CUDA registration of the shm region -------------------------------------------------

    def _register(self) -> None:
        """Page-lock the shm region in place (``cudaHostRegister``), once per connection."""
        span = region_span(self.client)
        if span is None:
            return  # a stream backend: records go through a pinned staging buffer
        base, size = span
        cudart = _cuda.cudart()
        with torch.cuda.device(self.device):
            rc = cudart.cudaHostRegister(base, size, 0)
        if int(rc) != 0:  # e.g. RLIMIT_MEMLOCK: still correct through a staging buffer
            self.path = f"pinned staging buffer (cudaHostRegister failed: {rc})"
            return
        self._registered = (base, size)
        columns = getattr(getattr(self.client.channel, "layout", None), "columns", False)
        self.path = "registered shm region" + (", result columns in one copy" if columns else "")

    def _load_runtime(self) -> None:
        """The runtime's own copy calls, where torch's runtime is a library in this process."""
        runtime = cudart.load()
        if runtime is None:
            self.path += "; slot block per step (the CUDA runtime library was not found)"
            return
        with torch.cuda.device(self.device):
            self._event = runtime.event()
        self._runtime = runtime
        if "columns" not in self.path:
            self.path += ", strided copies of the records' fields"

    def _stream(self) -> int:
        """The device's current stream, as the runtime's handle."""
        if _raw_stream is not None:
            index = self.device.index
            return int(_raw_stream(torch.cuda.current_device() if index is None else index))
        return int(torch.cuda.current_stream(self.device).cuda_stream)

    def _mark_copied(self, stream: int | None) -> None:
        """Record that the copies queued so far read the last result (``_settle`` waits)."""
        if self._runtime is not None:
            self._runtime.record(self._event, self._stream() if stream is None else stream)
        else:
            self._copied.record(torch.cuda.current_stream(self.device))
        self._pending = True

    def _wait_copied(self) -> None:
        if self._runtime is not None:
            self._runtime.synchronize(self._event)
        else:
            self._copied.synchronize()
        self._pending = False

    def _registered_span(self, address: int, nbytes: int) -> bool:
        span = self._registered
        return span is not None and span[0] <= address and address + nbytes <= span[0] + span[1]

    def _unregister(self) -> None:
        if self._registered is not None:
            base, _ = self._registered
            self._registered = None
            _cuda.cudart().cudaHostUnregister(base)

    # -- requests ----------------------------------------------------------------------------

    @property
    def num_envs(self) -> int:
        return self.client.num_envs

    @property
    def schema(self) -> Schema:
        return self.client.schema

    @property
    def copied_fields(self) -> list[str]:
        """Fields of the results seen so far that are not views: on the CPU those copied into
        tensors of their own each step (a row stride or address that is no multiple of the
        element size: a packed record's); on CUDA those gathered on the device after the block
        copy. Known once a result has been seen (the addresses are the received buffer's)."""
        return sorted(self._copied_names or ())

    def _path_text(self) -> str:
        """``path`` and what the results seen so far say of it: the fields that are copied."""
        copied = self._copied_names
        if self.cuda:
            if not copied:
                return self.path
            return f"{self.path}; unaligned, gathered on the device: {', '.join(sorted(copied))}"
        if copied is None:
            return f"{self.path} of aligned fields (copied_fields: after the first result)"
        if not copied:
            return self.path
        return f"{self.path} except {', '.join(sorted(copied))} (unaligned: copied each step)"

    def reset(self, seed: Any = None, *, copy: bool = False) -> TensorStep:
        """``Client.reset`` (seed, or one seed per env), its results as tensors."""
        self._settle()
        return self._tensors(self.client.reset(seed), copy)

    def step(self, actions: Any, *, copy: bool = False) -> TensorStep:
        """``Client.step``: ``actions`` a tensor (any device with data: see
        ``_host_actions``; bfloat16 and float8 widened to float32), an array or an int."""
        if isinstance(actions, torch.Tensor):
            actions = self._host_actions(actions)
        self._settle()
        return self._tensors(self.client.step(actions), copy)

    @property
    def finals(self) -> list[tuple[int, TensorStep]]:
        """SAME_STEP final results of the last step as ``(env index, TensorStep)`` (owned
        tensors on the device; rare: one per ended episode)."""
        out = []
        for index, view in self.client.finals:
            fields = {
                name: torch.from_numpy(np.array(view[name])).to(self.device)
                for name in view
                if torch_dtype(view[name].dtype) is not None
            }
            out.append((index, TensorStep(fields)))
        return out

    def _host_actions(self, actions: Any) -> np.ndarray:
        """A tensor of actions as the NumPy array the client takes: a view for a CPU tensor,
        one copy through a pinned buffer for a CUDA one. The tensor's dtype is kept, so the
        client's one action rule (``ActionShapes``: no float into an integer field, ranges
        checked) judges it as it judges a NumPy array. A contiguous tensor on the client's
        device goes through the runtime's own copy (``cudaMemcpyAsync`` on the current stream,
        then a wait for that stream: ~2 us of host time where ``copy_`` and an event cost
        several times that); the pinned buffer and its NumPy view are reused. The rest (a dtype
        NumPy has no type for, another device) is ``_unusual_actions``'s: no test on the way
        for the usual dtypes on the CPU."""
        if actions.device.type == "cpu":
            try:
                return np.asarray(actions.detach().numpy())
            except (TypeError, RuntimeError):  # bfloat16, float8, complex32: no NumPy dtype
                return self._unusual_actions(actions)
        if actions.device.type != "cuda" or not self.cuda:
            return self._unusual_actions(actions)  # MPS, XLA, meta; CUDA for a CPU client
        host, array = self._actions_host, self._actions_array
        if array is None or host.shape != actions.shape or host.dtype != actions.dtype:
            if actions.dtype in _WIDENED:  # widened on the device, then the usual path
                return self._host_actions(actions.float())
            pinned = torch.empty(tuple(actions.shape), dtype=actions.dtype, pin_memory=True)
            try:
                array = np.asarray(pinned.numpy())
            except (TypeError, RuntimeError):
                return self._unusual_actions(actions)
            host = self._actions_host = pinned
            self._actions_array = array
        runtime = self._runtime
        if runtime is not None and actions.device == self.device and actions.is_contiguous():
            stream = self._stream()
            runtime.copy_to_host(host.data_ptr(), actions.data_ptr(), array.nbytes, stream)
            runtime.synchronize_stream(stream)
            return array
        host.copy_(actions.detach(), non_blocking=True)
        self._acted.record(torch.cuda.current_stream(actions.device))
        self._acted.synchronize()
        return array

    def _unusual_actions(self, actions: Any) -> np.ndarray:
        """Actions the fast paths do not take, as an owned NumPy array: a tensor on a device
        other than the CPU and CUDA (MPS, XLA, ...; or CUDA for a CPU client) is copied to the
        CPU (``.cpu()``, which waits for it); a float dtype NumPy has no type for (``_WIDENED``:
        bfloat16, float8) is widened to float32 (exact). ``ActionError`` naming the device or
        dtype and what is taken where neither helps (a meta tensor holds no data; complex32)."""
        device = actions.device
        if device.type != "cpu":
            try:
                actions = actions.detach().cpu()
            except (RuntimeError, NotImplementedError) as exc:
                raise ActionError(
                    f"step(): actions on device {device} cannot be read ({_first_line(exc)}): "
                    f"pass a tensor on the CPU or a device with data (CUDA: through a pinned "
                    f"buffer; MPS, XLA, ...: copied to the CPU), a NumPy array or an int"
                ) from None
        if actions.dtype in _WIDENED:
            actions = actions.float()
        try:
            return np.asarray(actions.detach().numpy())
        except (TypeError, RuntimeError) as exc:
            raise ActionError(
                f"step(): actions of dtype {actions.dtype} cannot be read as a NumPy array "
                f"({_first_line(exc)}): pass an integer, bool or float tensor (bfloat16 and "
                f"float8 are widened to float32), a NumPy array or an int"
            ) from None

    def _copy_on_device(self, target: Any, source: Any, non_blocking: bool = True) -> None:
        """``target.copy_(source, non_blocking)``; where both are contiguous tensors of one
        dtype and shape on this client's device, the runtime's own copy on the current stream
        instead (~1 us of host time where ``copy_`` costs several; a copy within a device is
        asynchronous either way): the collector's observations, actions and extras into its
        buffer, every step."""
        runtime = self._runtime
        if (
            runtime is not None
            and source.dtype == target.dtype
            and source.shape == target.shape
            and source.device == self.device
            and target.device == self.device
            and source.is_contiguous()
            and target.is_contiguous()
        ):
            nbytes = target.numel() * target.element_size()
            runtime.copy_on_device(target.data_ptr(), source.data_ptr(), nbytes, self._stream())
            return
        target.copy_(source, non_blocking=non_blocking)

    def _settle(self) -> None:
        """Before a request may overwrite the slots (or the staging buffer): the copy of the
        last result out of them is finished."""
        if self._closed:
            raise TransportError(f"{self.client.url}: the client is closed")
        if self._pending:
            self._wait_copied()

    def _tensors(self, view: StepView, copy: bool) -> TensorStep:
        self.view = view
        plan = self._plans.get(id(view))
        if plan is None or plan.view is not view:
            if len(self._plans) >= 8:  # a replaced receive buffer: drop the old buffers' plans
                self._plans.clear()
            plan = self._plans[id(view)] = self._plan(view)
            if self._copied_names is None:
                self._copied_names = set()
            self._copied_names.update(plan.copied)
        step: TensorStep = plan.refresh(self)
        return step.clone() if copy else step

    def _plan(self, view: StepView) -> Any:
        if not self.cuda:
            return _HostPlan(view)  # columns too: each field is its column, viewed as is
        if isinstance(view.source, ColumnRecords):
            return _ColumnPlan(self, view)
        records = view.record
        nbytes = records.dtype.itemsize
        if records.ndim:
            nbytes += (records.shape[0] - 1) * records.strides[0]
        if self._runtime is not None and self._registered_span(_address(records), nbytes):
            return _StridedPlan(self, view)
        return _DevicePlan(self, view)

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for copies in flight, unregister the region from CUDA, close the client."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._pending:
                self._wait_copied()
            self._plans.clear()
            if self._runtime is not None:
                self._runtime.destroy(self._event)
                self._runtime = None
            self._unregister()
        finally:
            self.client.close()

    def __enter__(self) -> TorchClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed and sys.is_finalizing() is False:
                self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.client.num_envs} envs"
        return (
            f"TorchClient({self.client.url}, {state}, device={self.device} "
            f"({self.device_reason}), path={self._path_text()})"
        )


def connect(
    url: str,
    schema: Schema | str | Path | None = None,
    *,
    device: str | Any | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    max_body: int = DEFAULT_MAX_BODY,
    autoreset: AutoReset | str = AutoReset.DISABLED,
) -> TorchClient:
    """``transport.connect`` with results as tensors on ``device`` (chosen now: see
    ``choose_device``); the arguments are ``transport.connect``'s."""
    choose_device(device)  # a bad device fails before any connection is made
    client = _connect(url, schema, timeout=timeout, max_body=max_body, autoreset=autoreset)
    try:
        return TorchClient(client, device)
    except BaseException:
        client.close()
        raise
