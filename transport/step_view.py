"""``StepView``: a step or reset response's fields as NumPy arrays (views unless copied), the
one result type of the client, its asynchronous batches and the adapters. Below ``client`` and
``async_batch``, which both return it."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from transport.codec import row_bytes


class StepView:
    """The fields of a step or reset response as NumPy arrays, by attribute or by key.

    Views into the client's receive buffer unless made with ``copy=True``: valid until the next
    call on the client that returned them. ``observation`` of a batched call has shape (N, 612).
    """

    __slots__ = ("_fields", "source")

    def __init__(self, record: np.ndarray) -> None:
        self.source = record
        """What the fields view: the channel's record array, or (shm column layout) its
        ``ColumnRecords``, whose fields are the region's columns."""
        self._fields = {name: record[name] for name in record.dtype.names or ()}

    @property
    def record(self) -> np.ndarray:
        """The results as a record array: the views' own array, or for the shm column layout
        (fields in separate columns, not one array) an owned copy in the wire layout."""
        source = self.source
        return source if isinstance(source, np.ndarray) else np.asarray(source)

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> np.ndarray:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def keys(self) -> list[str]:
        return list(self._fields)

    def copy(self) -> StepView:
        source = self.source
        return StepView(copy_records(source) if isinstance(source, np.ndarray) else source.copy())

    def __repr__(self) -> str:
        shape = self.source.shape
        return f"StepView({', '.join(self._fields)}; envs={shape[0] if shape else 1})"


def copy_records(records: np.ndarray) -> np.ndarray:
    """An owned, C-contiguous copy of a record array, byte for byte (padding included): NumPy's
    own copy of records whose dtype has padding leaves those bytes unset (heap bytes in a copy
    a caller may hash, compare or write out), and copies field by field, which is slower."""
    return row_bytes(records.reshape(-1)).copy().view(records.dtype).reshape(records.shape)
