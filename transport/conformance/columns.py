"""The conformance suite's ``columns`` op: a column-layout shm region's columns area built from
wire records (docs/conformance.md; docs/shm.md, "Column layout").

``column_answer`` is the Python answer: it lays ``k`` request and result records into a buffer
through the same column views the shm backend maps (``region.column_views``), so what it
checks is the code a server and a client run. The runner computes it in process and requires
the testee's (Node's) answer to be identical byte for byte.
"""

from __future__ import annotations

from typing import Any

from transport.backends.shm.region import ShmLayout, column_views
from transport.codec import Schema

MAX_COLUMN_SLOTS = 4096
"""The most slots a ``columns`` request may ask for (the answer's area grows with them)."""


class ColumnRequestError(ValueError):
    """A ``columns`` request that cannot be answered (wrong record count or size, no layout)."""


def column_slots(seats: int) -> list[int]:
    """The region sizes the runner checks: 1, 3 and 8 slots, and the schema's seats."""
    return sorted({1, 3, 8, seats})


def column_answer(codecs: Schema, slots: Any, requests: Any, results: Any) -> dict[str, Any]:
    """``{"ok", "region_size", "offsets", "area"}`` for ``slots`` request and result records
    (wire bytes, one list each) of ``codecs``' column layout: the region's bytes from the first
    column's start C0(k) to region_size(k), every column filled."""
    shm = codecs.ir.shm
    if shm is None or not shm.columns:
        raise ColumnRequestError(f"schema {codecs.name} has no column shm layout")
    if not isinstance(slots, int) or isinstance(slots, bool) or not 1 <= slots <= MAX_COLUMN_SLOTS:
        raise ColumnRequestError(f"slots must be an integer 1..{MAX_COLUMN_SLOTS}, not {slots!r}")
    layout = ShmLayout.of(codecs)
    size = layout.region_size(slots)
    columns = layout.column_map(slots)
    first = columns[0].start
    buffer = bytearray(size)
    request_columns, result_columns = column_views(layout, buffer, slots)
    for what, codec, records, views in (
        ("requests", layout.request, requests, request_columns),
        ("results", layout.result, results, result_columns),
    ):
        if not isinstance(records, list) or len(records) != slots:
            raise ColumnRequestError(f"{what} must be a list of {slots} records")
        for i, record in enumerate(records):
            if not isinstance(record, bytes | bytearray) or len(record) != codec.size:
                raise ColumnRequestError(
                    f"{what}[{i}] must be {codec.size} bytes (a {codec.ir.name} wire record)"
                )
        rows = codec.view(b"".join(records), count=slots)
        for name, column in views.items():
            column[...] = rows[name]
    del request_columns, result_columns  # views of the buffer: gone before it is read
    return {
        "ok": True,
        "region_size": size,
        "offsets": {c.key: c.start for c in columns},
        "area": bytes(buffer[first:size]),
    }
