"""shm:// slot commands the client API never sends on a subset of slots: STEP_MULTI on fewer
than the seats' slots and OBSERVE on some envs' slots only. Both servers answer BAD_BATCH with
the same words (before: the Python server called them an unknown command, UNKNOWN_MESSAGE,
and so did both for OBSERVE: exploration 38, a client written from docs/shm.md alone)."""

from __future__ import annotations

import pytest

import transport
from transport.backends.shm.channel import _Refused
from transport.backends.shm.region import SlotCommand
from transport.protocol import ErrorCode

from .servers import ServerProcess, require_lang, unique_url


def _subset(client: transport.Client, command: int, slots: int) -> _Refused:
    """``command`` in slots 0..slots-1 only (the channel's slot count lowered for one exchange):
    the server's answer (the slot's status and text), which must be an error."""
    channel = client.channel
    channel._ctx.n = slots  # type: ignore[attr-defined]
    try:
        with pytest.raises(_Refused) as caught:
            channel._exchange(command)  # type: ignore[attr-defined]
    finally:
        channel._ctx.n = client.num_envs  # type: ignore[attr-defined]
    return caught.value


@pytest.mark.parametrize("lang", ["python", "node"])
def test_subset_step_multi_and_observe_are_bad_batch(lang: str) -> None:
    require_lang(lang)
    with ServerProcess(unique_url("shm"), env="pac", lang=lang, num_envs=8) as server:
        with transport.connect(server.url, timeout=10) as client:
            client.reset(seed=1)
            multi = _subset(client, SlotCommand.STEP_MULTI, 7)
            assert multi.code == ErrorCode.BAD_BATCH, multi
            assert "STEP_MULTI needs slots 0..7 and no others (7 slots asked)" in str(multi)
            observe = _subset(client, SlotCommand.OBSERVE, 3)
            assert observe.code == ErrorCode.BAD_BATCH, observe
            assert "OBSERVE needs slots 0..7 and no others (3 slots asked)" in str(observe)
            # the session goes on
            client.reset(seed=2)
            client.observe()
