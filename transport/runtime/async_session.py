"""The stream protocol's asynchronous-batch messages (SEND, RECV, ASYNC_RESET) for a
``Session``: body checks and decoding here, every env rule in ``AsyncBatches``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import msgpack
import numpy as np

from transport.codec import Schema, StructCodec, row_bytes
from transport.protocol import AutoReset, ErrorCode, RequestError, body_codec
from transport.runtime.async_batches import AsyncBatches
from transport.runtime.core import EnvRuntime


class Session(Protocol):
    """What the handlers read of their ``transport.runtime.session.Session`` (a structural
    type: that module imports this one, so this one does not import it back)."""

    schema: Schema
    runtime: EnvRuntime
    step_request: StructCodec
    result: StructCodec
    num_envs: int
    action_name: str
    _finals_buffer: Any  # a bytearray, or a shared mapping with worker processes

    def _expect_size(self, body: memoryview, size: int, what: str) -> None: ...


class AsyncHandlers:
    """SEND_REQ, RECV_REQ and ASYNC_RESET_REQ of one session (None when the schema has none)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.batches = AsyncBatches(session.runtime)
        ir = session.schema.ir
        msgs = ir.messages
        self.send_resp = msgs["SEND_RESP"].id
        self.recv_resp = msgs["RECV_RESP"].id
        self.recv_request = body_codec(session.schema, "RECV_REQ")
        self.seed_request = body_codec(session.schema, "ASYNC_RESET_REQ")
        self.handlers: dict[int, Callable[[memoryview], tuple[int, bytes]]] = {
            msgs["SEND_REQ"].id: self.send,
            msgs["RECV_REQ"].id: self.recv,
            msgs["ASYNC_RESET_REQ"].id: self.reset,
        }

    @staticmethod
    def of(session: Session) -> AsyncHandlers | None:
        msgs = session.schema.ir.messages
        names = ("SEND_REQ", "SEND_RESP", "RECV_REQ", "RECV_RESP", "ASYNC_RESET_REQ")
        return AsyncHandlers(session) if all(n in msgs for n in names) else None

    def send(self, body: memoryview) -> tuple[int, bytes]:
        """K requests, then a msgpack array of K env ids."""
        s = self.session
        size = s.step_request.size
        n = s.num_envs
        ids = send_env_ids(body, size, n)
        k = len(ids)
        actions = s.step_request.view(body, count=k)[s.action_name]
        self.batches.send(ids, np.array(actions))
        return self.send_resp, b""

    def recv(self, body: memoryview) -> tuple[int, bytes]:
        """B results, then msgpack [env ids, ended env ids, their final results' bytes]."""
        s = self.session
        s._expect_size(body, self.recv_request.size, "RECV_REQ")
        batch_size = int(self.recv_request.view(body)["batch_size"])
        ids, ended = self.batches.recv(batch_size)
        results = s.runtime.runner.results[: s.num_envs]
        data = row_bytes(results)[ids].tobytes()  # byte rows: records[ids] leaves padding unset
        finals = b""
        if ended and s.runtime.autoreset == AutoReset.SAME_STEP:
            size = s.result.size
            finals = b"".join(bytes(s._finals_buffer[i * size : (i + 1) * size]) for i in ended)
        else:
            ended = []
        return self.recv_resp, data + msgpack.packb([ids, ended, finals])

    def reset(self, body: memoryview) -> tuple[int, bytes]:
        s = self.session
        s._expect_size(body, self.seed_request.size, "ASYNC_RESET_REQ")
        check_seed_flags(
            body, body.nbytes, self.seed_request.ir.fields[1].offset, "ASYNC_RESET_REQ"
        )
        entry = self.seed_request.view(body)
        self.batches.reset(int(entry["seed"]) if entry["has_seed"] else None)
        return self.send_resp, b""


def check_seed_flags(body: memoryview, size: int, flag_at: int, what: str) -> None:
    """Strict decoding of EnvSeed entries (RESET_SEEDS_REQ, ASYNC_RESET_REQ): a ``has_seed``
    byte other than 0 or 1 is refused, BAD_BODY_SIZE (docs/schema.md "Canonical bytes"; Node:
    ``checkSeedFlags``, the same words). Padding is not checked."""
    flags = np.frombuffer(body, dtype=np.uint8)[flag_at::size]
    bad = flags > 1
    if bad.any():
        index = int(np.argmax(bad))
        raise RequestError(
            ErrorCode.BAD_BODY_SIZE,
            f"{what} entry {index}: has_seed byte is {int(flags[index])}, expected 0 or 1",
        )


def send_env_ids(body: memoryview, size: int, n: int) -> list[int]:
    """SEND_REQ's env ids: the msgpack array of K integers after K requests (K from the array
    header: 0x90 | K below 16, else 0xDC and a big-endian u16); BAD_BATCH for any other body,
    and for an array of K whose items are not all msgpack integers (a bool, a float such as
    1.0, a string: Node's sendEnvIds refuses the same). Integers of any size come back exact:
    the range check is ``check_send``'s."""
    for k in range(1, n + 1):
        at = k * size
        if at >= body.nbytes:
            break
        head = body[at]
        if head != (0x90 | k if k < 16 else 0xDC):
            continue
        try:
            ids = msgpack.unpackb(body[at:], raw=True, strict_map_key=False)  # any item: its type
        except Exception:
            continue
        if isinstance(ids, list) and len(ids) == k:
            if not all(type(i) is int for i in ids):  # a bool is an int subclass, not an id
                raise RequestError(ErrorCode.BAD_BATCH, "SEND_REQ env ids must be integers")
            return ids
    raise RequestError(
        ErrorCode.BAD_BATCH,
        f"SEND_REQ of {body.nbytes} bytes is not K requests of {size} bytes and a msgpack "
        "array of K env ids (1 <= K <= num_envs)",
    )
