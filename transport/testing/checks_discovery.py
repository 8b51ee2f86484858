"""Contract checks of schema discovery (issue 12 item 8): a client with no schema file gets the
server's compiled schema in the handshake, and a pinned client with another schema is refused
with both schemas named (docs/client.md, "Connecting without a schema file")."""

from __future__ import annotations

import random
from dataclasses import replace

import transport
from transport.codec import Schema
from transport.errors import FingerprintMismatchError
from transport.testing.checks import (
    TIMEOUT,
    CheckContext,
    _check,
    _expect_results,
    _other_schema,
    _pick,
    _still_served,
    wire_action,
)
from transport.testing.model import ExpectedSession
from transport.testing.servers import SERVER_SEED


@_check(per_schema=True)
def check_discover_schema(ctx: CheckContext) -> None:
    """A client without a schema discovers the server's (same fingerprint, name and codecs),
    then resets and steps with results byte-equal to the local env's."""
    server = ctx.server(1)
    with transport.connect(server.url, timeout=TIMEOUT) as client:
        found = client.schema
        assert found.fingerprint == ctx.schema.fingerprint, (
            f"discovered {found.name} ({found.fingerprint:016x}), the server serves "
            f"{ctx.schema.name} ({ctx.schema.fingerprint:016x})"
        )
        assert found.name == ctx.schema.name, f"discovered the name {found.name!r}"
        assert found is not ctx.schema  # built from the IR the server sent, not looked up
        model = ExpectedSession(ctx.schema, 1, server_seed=SERVER_SEED)
        _expect_results(client.reset(11), model.reset(11), "reset of a discovering client")
        rng = random.Random(3)
        for step in range(3):
            if model.done(0):
                break
            actions = _pick(model, rng)
            results, _, _ = model.step(actions)
            view = client.step(wire_action(ctx.schema, actions[0]))
            _expect_results(view, results, f"discovered step {step + 1}")


@_check(per_schema=False)
def check_mismatch_names_both_schemas(ctx: CheckContext) -> None:
    """A client pinned to another schema is refused with a message naming both schemas (name
    and fingerprint of each side) and the server's URL; the server goes on serving."""
    server = ctx.server()
    other = _other_schema(ctx.schema)
    renamed = Schema(replace(other.ir, name="other_env"))
    try:
        client = transport.connect(server.url, renamed, timeout=TIMEOUT)
    except FingerprintMismatchError as exc:
        text = str(exc)
        wanted = [
            ctx.schema.name,
            f"{ctx.schema.fingerprint:016x}",
            "other_env",
            f"{renamed.fingerprint:016x}",
        ]
        missing = [part for part in wanted if part not in text]
        assert not missing, f"{missing} not named in {text!r}"
        assert server.url.partition("?")[0] in text, f"the URL is not named in {text!r}"
    else:
        client.close()
        raise AssertionError("a client pinned to another schema was accepted")
    _still_served(ctx, server, "after a named mismatch")
