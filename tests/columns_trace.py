"""What the column-layout tests of both server languages share: legal actions for the contract
env, field-by-field equality, and one run of a column region against the same env over unix."""

from __future__ import annotations

from typing import Any

import numpy as np

from transport.testing.contract_env import POISON_ACTION


def legal_actions(mask: np.ndarray, turn: int) -> np.ndarray:
    """One legal action per env from its mask (never the contract env's poison action)."""
    out = []
    for i, row in enumerate(np.atleast_2d(mask)):
        allowed = np.flatnonzero(row)
        allowed = allowed[allowed != POISON_ACTION]
        out.append(allowed[(turn + i) % len(allowed)])
    return np.array(out, dtype=np.int32)


def same_fields(a: Any, b: Any, what: str) -> None:
    assert list(a.keys()) == list(b.keys())
    for name in a.keys():
        assert np.array_equal(a[name], b[name]), f"{what}: field {name} differs"


def mapping_root(array: Any) -> Any:
    """The object at the end of ``array``'s base chain: the buffer it views."""
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return array


def trace_against_unix(shm: Any, unix: Any, n: int, mode: str, turns: int, seed: int) -> Any:
    """Reset and step ``shm`` (a column region) and ``unix`` alike: every result and final
    equal, the actions in the request column, episodes ending; returns the last shm result."""
    region = shm.channel.region
    a, b = shm.reset(seed=seed), unix.reset(seed=seed)
    same_fields(a, b, "reset")
    ended = 0
    for turn in range(turns):
        actions = legal_actions(a.action_mask, turn)
        a = shm.step(actions if n > 1 else actions[:1])
        b = unix.step(actions if n > 1 else actions[:1])
        same_fields(a, b, f"{mode} step {turn}")
        assert [i for i, _ in shm.finals] == [i for i, _ in unix.finals]
        for (_, fa), (_, fb) in zip(shm.finals, unix.finals, strict=True):
            same_fields(fa, fb, f"{mode} final of step {turn}")
        assert np.array_equal(region.request_columns["action"][:n], actions[:n])
        done = np.logical_or(a.terminated, a.truncated)
        ended += int(np.count_nonzero(done)) + len(shm.finals)
        if mode == "disabled" and done.any():
            a, b = shm.reset(seed=turn), unix.reset(seed=turn)
            same_fields(a, b, f"reset after step {turn}")
    assert ended > 0  # episodes ended in the run: the finals path was taken
    return a
