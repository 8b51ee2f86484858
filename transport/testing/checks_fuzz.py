"""A seeded, bounded fuzzer in the contract: hostile frames through the backend's own channel.

Each request is a message type (a request of the protocol, a response or ERROR sent the wrong
way, or any byte) with a body that is empty, the right size, one byte off, random, or a valid
body with random bytes written over it. The server must answer every one, within the client's
timeout, with a response of the protocol or a typed ERROR, or close the connection; never hang,
never die, and keep serving the clients it already had (issue 17: the adversarial pass).
"""

from __future__ import annotations

import random
from typing import Any

from transport.client import Client
from transport.errors import PeerGoneError, TransportTimeoutError
from transport.protocol import ERROR_HEAD, ErrorCode, MessageIds
from transport.testing.checks import (
    CheckContext,
    NotApplicable,
    _check,
    _still_served,
)

FUZZ_SEED = 20261125
FUZZ_REQUESTS = 160
"""Requests per server: enough to reach every message type and body shape several times and
still finish in about a second a cell."""
FUZZ_TIMEOUT = 5.0
"""A fuzzed request must be answered (or its connection closed) within this: a hang fails."""


def _body_sizes(ctx: CheckContext, ids: MessageIds) -> dict[int, int]:
    """The fixed body size of each request message of the schema (0 for an empty body)."""
    from transport.protocol import body_codec

    sizes = {}
    for name in ("STEP_REQ", "STEP_MULTI_REQ", "RESET_SEED_REQ", "HELLO_REQ"):
        sizes[getattr(ids, name)] = body_codec(ctx.schema, name).size
    for name in ("STEP_BATCH_REQ", "RESET_SEEDS_REQ"):
        sizes[getattr(ids, name)] = body_codec(ctx.schema, name).size  # one env's entry
    for name in ("RESET_REQ", "OBSERVE_REQ", "HEALTH_REQ", "SPACES_REQ"):
        sizes[getattr(ids, name)] = 0
    return sizes


def _fuzzed_request(
    rng: random.Random, sizes: dict[int, int], ids: MessageIds
) -> tuple[int, bytes]:
    """One hostile (msg_type, body)."""
    roll = rng.random()
    if roll < 0.7:
        msg_type = rng.choice(sorted(sizes))
    elif roll < 0.85:
        msg_type = rng.choice([ids.ERROR, ids.STEP_RESP, ids.HELLO_RESP, ids.RESET_RESP])
    else:
        msg_type = rng.randrange(256)
    size = sizes.get(msg_type, rng.randrange(64))
    length = rng.choice([0, size, max(size - 1, 0), size + 1, rng.randrange(1, 4096)])
    body = bytearray(length)
    if rng.random() < 0.5 and length == size:
        return msg_type, bytes(body)  # a well-formed zero body (action 0, seed 0, ...)
    for _ in range(rng.randrange(1, 9)):
        if length:
            body[rng.randrange(length)] = rng.randrange(256)
    if rng.random() < 0.3:
        body[:] = rng.randbytes(length)
    return msg_type, bytes(body)


def _answer_is_typed(ids: MessageIds, msg_type: int, body: Any, what: str) -> None:
    responses = {
        ids.RESET_RESP,
        ids.STEP_RESP,
        ids.STEP_MULTI_RESP,
        ids.OBSERVE_RESP,
        ids.HEALTH_RESP,
        ids.SPACES_RESP,
        ids.HELLO_RESP,
        ids.STEP_BATCH_RESP,
    }
    if msg_type == ids.ERROR:
        data = bytes(body)
        assert len(data) >= ERROR_HEAD.size, f"{what}: an ERROR of {len(data)} bytes"
        code, text_len = ERROR_HEAD.unpack_from(data, 0)
        assert len(data) == ERROR_HEAD.size + text_len, f"{what}: an ERROR body of the wrong size"
        assert code in {int(c) for c in ErrorCode}, f"{what}: an ERROR with the unknown code {code}"
    else:
        assert msg_type in responses, f"{what}: answered with message type 0x{msg_type:02X}"


@_check(per_schema=False)
def check_fuzzed_frames(ctx: CheckContext) -> None:
    """160 seeded hostile frames (any type, empty, off-by-one, random or scribbled bodies) on
    connected sessions: each gets a response or a typed ERROR or a closed connection within the
    timeout; a client connected before keeps stepping and a new one is served."""
    server = ctx.server()
    scheme = server.url.partition("://")[0]
    if scheme == "shm":
        raise NotApplicable("shm:// has no frames: requests are slot commands")
    ids = MessageIds.from_schema(ctx.schema.ir)
    sizes = _body_sizes(ctx, ids)
    if scheme == "http":  # an HTTP channel can only say the protocol's request types
        sizes = {t: s for t, s in sizes.items() if t != ids.HELLO_REQ}
    rng = random.Random(FUZZ_SEED)
    with ctx.connect(server) as bystander:
        bystander.reset(5)
        client: Client | None = None
        closed = answered = 0
        try:
            for n in range(FUZZ_REQUESTS):
                if client is None:
                    client = ctx.connect(server, timeout=FUZZ_TIMEOUT)
                    client.reset(n)
                msg_type, body = _fuzzed_request(rng, sizes, ids)
                if scheme == "http" and msg_type not in sizes:
                    msg_type = rng.choice(sorted(sizes))
                what = f"fuzzed request {n} (type 0x{msg_type:02X}, {len(body)} bytes)"
                try:
                    got_type, got_body = client.channel.request(msg_type, body)
                except PeerGoneError:
                    client.close()
                    client, closed = None, closed + 1
                    continue
                except TransportTimeoutError as exc:
                    raise AssertionError(f"{what}: no answer in {FUZZ_TIMEOUT} s") from exc
                _answer_is_typed(ids, got_type, got_body, what)
                answered += 1
        finally:
            if client is not None:
                client.close()
        assert answered > FUZZ_REQUESTS // 4, f"only {answered} answered, {closed} closed"
        bystander.step([0] * bystander.num_envs if bystander.num_envs > 1 else 0)
    _still_served(ctx, server, f"after {FUZZ_REQUESTS} fuzzed frames")
