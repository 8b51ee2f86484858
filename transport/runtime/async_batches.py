"""Asynchronous batches in the env runtime: SEND steps some envs without waiting, RECV returns
the first results that are ready (EnvPool's ``send`` / ``recv``, gymnasium's ``AsyncState``).

Every rule of the asynchronous API lives here, once: which env ids a SEND may carry (in range,
each once, none already in flight), the action checks (those of a lock-step STEP), auto-reset
(the runner's ``step_one``), "RECV needs something in flight", and env-error recovery. The
runner decides how envs run: in this process they step at SEND; a worker pool steps them
concurrently and reports each as it finishes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from transport.protocol import MESSAGE_IDS, AutoReset, ErrorCode, MessageIds, RequestError
from transport.runtime.core import EnvRuntime, action_values, step_before_reset

_MESSAGE_NAMES: dict[int, str] = {
    getattr(MESSAGE_IDS, field.name): field.name for field in dataclasses.fields(MessageIds)
}
"""msg_type -> the protocol's name for it (the ids are the envelope's, the same in every schema)."""


def _async_state(text: str) -> RequestError:
    return RequestError(ErrorCode.ASYNC_STATE, text)


def request_name(request: int | str) -> str:
    """A request as an ASYNC_STATE text names it: its message name (``STEP_BATCH_REQ``) for a
    msg_type; a text (a message name) as is."""
    if isinstance(request, str):
        return request
    return _MESSAGE_NAMES.get(request, f"msg_type 0x{request:02X}")


# -- the rules, as pure functions: the runtime's AsyncBatches and the shm channel (whose slots
# carry each env's request on their own, docs/shm.md "Asynchronous batches") both call them


def check_idle(count: int, request: int | str) -> None:
    """A lock-step request (a msg_type, or a message name) while envs are in flight is refused
    (their results would mix); the text names the request and what to call instead."""
    if count:
        raise _async_state(
            f"{request_name(request)} while {count} env(s) are in flight: "
            "call recv() for their results first"
        )


def check_send(ids: list[int], num_envs: int, in_flight: np.ndarray) -> None:
    """A SEND of env ``ids``: at least one, each in range, each once, none in flight."""
    n = num_envs
    if len(ids) == 0:
        raise RequestError(ErrorCode.BAD_BATCH, "SEND_REQ carries no env")
    for i in ids:
        if not 0 <= i < n:
            raise RequestError(ErrorCode.BAD_BATCH, f"env id {i} is outside 0..{n - 1}")
    if len(set(ids)) != len(ids):
        seen: set[int] = set()
        for i in ids:
            if i in seen:
                raise _async_state(f"env {i} appears twice in one SEND_REQ")
            seen.add(i)
    for i in ids:
        if in_flight[i]:
            raise _async_state(
                f"env {i} is already in flight: call recv() for its result before sending it again"
            )


def check_reset_sent(ids: list[int], reset_sent: bool) -> None:
    """A SEND (after ``check_send``) from a client that sent no reset yet in its session: the
    NOT_RESET of its first env, as the runtime's action check gives it at SEND. The shm client
    asks this itself (its SEND publishes the slots without waiting for the server); a reset it
    sent that failed for some env stays the server's to refuse (at RECV)."""
    if not reset_sent and ids:
        raise step_before_reset(ids[0])


def check_recv(count: int, batch_size: int) -> int:
    """How many results a RECV returns: ``min(batch_size, in flight)``; refused with none in
    flight or a batch size below 1."""
    if count == 0:
        raise _async_state("RECV_REQ with no env in flight: call send() (or async_reset()) first")
    if batch_size < 1:
        raise RequestError(ErrorCode.BAD_BATCH, "RECV_REQ batch_size must be at least 1")
    return min(batch_size, count)


class AsyncBatches:
    """One client's envs in flight (sent, their result not received yet)."""

    def __init__(self, runtime: EnvRuntime) -> None:
        self.runtime = runtime
        self.num_envs = runtime.num_envs
        self.in_flight = np.zeros(self.num_envs, dtype=bool)
        self.stepped = np.zeros(self.num_envs, dtype=bool)  # sent to step (not reset, noop)
        self.count = 0
        self._ready: list[tuple[int, bool]] = []  # finished without a step (reset, noop)

    def check_idle(self, request: int | str) -> None:
        check_idle(self.count, request)

    def send(self, ids: Sequence[int] | np.ndarray, actions: np.ndarray) -> None:
        """Start stepping env ``ids[k]`` with ``actions[k]``; every check comes first, so a
        refused SEND starts nothing (ids as decoded, any size: an id outside 0..N-1 is a
        BAD_BATCH of ``check_send``, never a numpy overflow)."""
        if len(ids) != len(actions):
            raise RequestError(
                ErrorCode.BAD_BATCH, f"SEND_REQ carries {len(actions)} actions, {len(ids)} env ids"
            )
        id_list = [int(i) for i in (ids.tolist() if isinstance(ids, np.ndarray) else ids)]
        check_send(id_list, self.num_envs, self.in_flight)
        in_flight = self.in_flight
        rt = self.runtime
        mode = rt.autoreset
        if rt.accepts_array_subset(id_list, actions):  # nothing to refuse, no noop, none done
            self.stepped[id_list] = True
            in_flight[id_list] = True
            self.count += len(id_list)
            runner = rt.runner
            # a pool takes the decoded array (one copy into its mapping); in this process each
            # env gets its own value (action_values)
            taken = cast("Sequence[Any]", actions) if runner.concurrent else action_values(actions)
            runner.submit(id_list, taken, mode)
            return
        values = action_values(actions)
        noop: list[int] = []
        for i, action in zip(id_list, values, strict=True):
            if not (mode == AutoReset.NEXT_STEP and rt.is_done(i)) and rt.check_action(i, action):
                noop.append(i)
        stepped = [(i, a) for i, a in zip(id_list, values, strict=True) if i not in noop]
        for i, _ in stepped:
            self.stepped[i] = not (mode == AutoReset.NEXT_STEP and rt.is_done(i))
        for i in noop:
            rt._noop(i)
            self.stepped[i] = False
            if rt.watchdog is not None:
                rt.watchdog.reset(i)
            self._ready.append((i, False))
        for i in id_list:
            in_flight[i] = True
        self.count += len(id_list)
        if stepped:
            rt.runner.submit([i for i, _ in stepped], [a for _, a in stepped], mode)

    def reset(self, seed: int | None) -> None:
        """ASYNC_RESET: reset every env (env i: ``seed + i``); RECV returns them."""
        check_idle(self.count, "ASYNC_RESET_REQ")
        rt = self.runtime
        if seed is None:
            rt.reset()
        else:
            rt.reset_seed(seed)
        self._ready = [(i, False) for i in range(self.num_envs)]
        self.in_flight[:] = True
        self.count = self.num_envs

    def harvest(
        self, check_workers: bool = False
    ) -> tuple[list[int], list[int], list[tuple[int, RequestError]]]:
        """Without waiting: (envs finished, those whose SAME_STEP final result was kept, envs
        that failed with their error); all leave flight (a server that publishes each env as it
        finishes: shm). A failed env is recovered as a RECV would."""
        out = self._ready
        self._ready = []
        failed: list[tuple[int, RequestError]] = []
        rt = self.runtime
        for i, ended, exc in self._progress(rt.runner.poll_ready(check_workers)):
            if exc is None:
                out.append((i, ended))
            else:
                failed.append((i, rt._recover_one(i, exc, None, "SEND (asynchronous step)")))
        for i, _ in out:
            self.in_flight[i] = False
        for i, _ in failed:
            self.in_flight[i] = False
        self.count -= len(out) + len(failed)
        return [i for i, _ in out], [i for i, ended in out if ended], failed

    def _progress(
        self, done: list[tuple[int, bool, Exception | None]]
    ) -> list[tuple[int, bool, Exception | None]]:
        """The no-progress watchdog's look at envs whose asynchronous step just ended, as a
        lock-step step has it: an env that made no progress fails with its NoProgressError."""
        watchdog = self.runtime.watchdog
        if watchdog is None:
            return done
        out: list[tuple[int, bool, Exception | None]] = []
        for i, ended, exc in done:
            if exc is None and self.stepped[i] and not ended:
                stalled = watchdog.check((i,), None)
                if stalled:
                    exc = stalled[0][1]
            elif exc is None:  # reset (NEXT_STEP), or its result is the reset's (SAME_STEP)
                watchdog.reset(i)
            out.append((i, ended, exc))
        return out

    def recv(self, batch_size: int) -> tuple[list[int], list[int]]:
        """The first ``min(batch_size, in flight)`` envs that finished: (env ids, the ids of
        those whose SAME_STEP final result was kept). Their results are in the runtime's rows."""
        want = check_recv(self.count, batch_size)
        out = self._ready[:want]
        del self._ready[:want]
        failures = []
        if len(out) < want:
            for i, ended, exc in self._progress(self.runtime.runner.poll(want - len(out))):
                if exc is None:
                    out.append((i, ended))
                else:
                    failures.append((i, exc))
        for i, _ in failures:
            self.in_flight[i] = False
            self.count -= 1
        if failures:
            self._ready[:0] = out  # the others come with the next RECV
            rt = self.runtime
            raise rt._recover(failures, None, lambda i: "SEND (asynchronous step)")
        ids = [i for i, _ in out]
        self.in_flight[ids] = False
        self.count -= len(ids)
        return ids, [i for i, ended in out if ended]
