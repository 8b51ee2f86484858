"""Asynchronous batches on the client (EnvPool's ``send`` / ``recv``): ``Client.send`` starts
stepping some envs, ``Client.recv`` returns the first results that are ready with their env ids.

The wire messages are SEND_REQ / RECV_REQ / ASYNC_RESET_REQ (schema/protocol.toml); every rule
(env ids in range and sent once, "RECV needs something in flight") is the server's env runtime's
(transport/runtime/async_batches.py), so both client languages get the same errors. The actions
of a SEND are checked here, before any bytes move, by the client's one rule for actions
(``ActionShapes``: step's, with K env ids in place of N envs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import msgpack
import numpy as np

from transport.codec import Schema
from transport.errors import ProtocolError
from transport.protocol import body_codec, split_recv_tail
from transport.step_view import StepView, copy_records

if TYPE_CHECKING:
    from transport.actions import ActionShapes

Exchange = Callable[[int, Any, int], memoryview]
"""The client's one request: (message type, body, expected response type) -> response body."""


class Received(NamedTuple):
    """One RECV: B results (a leading axis of B; views valid until the next request unless
    copied), the env id of each row, and the SAME_STEP final results of the episodes that ended
    (env id, owned result)."""

    results: StepView
    env_ids: np.ndarray
    finals: list[tuple[int, StepView]]


class AsyncCalls:
    """The encoders and decoders of one client's asynchronous calls."""

    def __init__(
        self, schema: Schema, num_envs: int, exchange: Exchange, shapes: ActionShapes
    ) -> None:
        self.num_envs = num_envs
        self.exchange = exchange
        self.shapes = shapes
        msgs = schema.ir.messages
        missing = [
            n for n in ("SEND_REQ", "RECV_REQ", "ASYNC_RESET_REQ", "RECV_RESP") if n not in msgs
        ]
        if missing:
            raise ProtocolError(
                f"schema {schema.name} has no asynchronous batches ({', '.join(missing)})"
            )
        self.send_req, self.send_resp = msgs["SEND_REQ"].id, msgs["SEND_RESP"].id
        self.recv_req, self.recv_resp = msgs["RECV_REQ"].id, msgs["RECV_RESP"].id
        self.reset_req = msgs["ASYNC_RESET_REQ"].id
        self.request = body_codec(schema, "STEP_REQ")
        action = self.request.ir.role("action")
        assert action is not None  # the client checked it
        self.action_name = action.name
        self.result = body_codec(schema, "STEP_RESP")
        self.recv_codec = body_codec(schema, "RECV_REQ")
        self.seed_codec = body_codec(schema, "ASYNC_RESET_REQ")

    def send_body(
        self, actions: Sequence[Any] | np.ndarray, env_ids: Sequence[int] | np.ndarray
    ) -> bytes:
        """The SEND_REQ body of action ``actions[k]`` for env ``env_ids[k]``: K step requests,
        then the msgpack array of the K env ids. The actions are checked first (``ActionShapes
        .rows``: shape (K, *S), values that fit the action field; ``ActionError`` naming
        ``send()``); nothing is sent here, and nothing shared is written (no lock needed)."""
        ids = np.asarray(env_ids).reshape(-1).tolist()
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int):  # a float was truncated silently
                raise TypeError(
                    f"send(): env ids are integers, not {type(i).__name__} {i!r} (protocol: "
                    "SEND_REQ env ids are msgpack integers)"
                )
        k = len(ids)
        if k == 0 or k > self.num_envs:
            raise ValueError(f"send takes 1..{self.num_envs} env ids, got {k}")
        values = self.shapes.rows(actions, k)
        body = bytearray(k * self.request.size)
        self.request.view(body, count=k)[self.action_name] = values
        packed: bytes = msgpack.packb(ids)
        return bytes(body) + packed

    def send(self, body: bytes) -> None:
        """Exchange a SEND_REQ body (``send_body``; the caller holds the client)."""
        self.exchange(self.send_req, body, self.send_resp)

    def recv(self, batch_size: int, copy: bool) -> Received:
        body = memoryview(bytearray(self.recv_codec.size))
        self.recv_codec.view(body)["batch_size"] = batch_size
        resp = self.exchange(self.recv_req, body, self.recv_resp)
        tail = split_recv_tail(resp, self.result.size, batch_size)
        records = self.result.view(resp, 0, count=tail.count)
        if copy:
            records = copy_records(records)
        finals = [
            (index, StepView(self.result.view(bytearray(data))))
            for index, data in tail.final_rows(self.result.size)
        ]
        return Received(StepView(records), np.asarray(tail.env_ids, dtype=np.int64), finals)

    def reset(self, seed: int | None) -> None:
        body = memoryview(bytearray(self.seed_codec.size))
        view = self.seed_codec.view(body)
        view["seed"] = 0 if seed is None else seed
        view["has_seed"] = seed is not None
        self.exchange(self.reset_req, body, self.send_resp)
