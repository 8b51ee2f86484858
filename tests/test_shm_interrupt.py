"""Ctrl-C (a real SIGINT) while an shm:// client waits for its server.

The client waits in C (futex, after a spin), and used to retry a wait that a signal interrupted
without returning to Python: KeyboardInterrupt came only once the server answered (a stopped
server and ``timeout=None``: never). Now a client wait returns to Python when a signal
interrupts its sleep, and at least every ``TP_CHECK_MS`` while it sleeps (a signal that came
while it spun, or to another thread), runs the handlers, and resumes to its first deadline.
After a KeyboardInterrupt the client stays usable: the next call first waits for the
interrupted request (as after a timeout), so its results are its own.

Real server processes (``transport-serve``) running the gated echo env of
tests/shm_close_in_flight_env.py: action ``SLOW`` waits for a gate file, so the step is in
flight for as long as a test wants, with no timing guess. Each test opens the gate (or resumes
the stopped server) after ``RELEASE_S`` at the latest, so that without the fix it fails on the
bound instead of hanging.
"""

from __future__ import annotations

import glob
import os
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import transport

from .servers import ServerProcess
from .shm_close_in_flight_env import GATE_ENV, SLOW

N = 4
RELEASE_S = 20.0
"""When the gate opens (or the stopped server resumes) on its own: past the bound below."""
BOUND_S = 5.0
"""A Ctrl-C must cut the wait well within this (it takes ~0.05 s)."""


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, int]]:
    """A gated 4-env shm server; (its URL, the gate file, its pid)."""
    gate = os.path.join(tempfile.gettempdir(), f"transport-kigate-{uuid.uuid4().hex[:12]}")
    monkeypatch.setenv(GATE_ENV, gate)  # the server inherits it
    url = f"shm://test-ki-{uuid.uuid4().hex[:12]}?num_envs={N}"
    extra = ["--schema", "schema/pac_env.toml"]
    try:
        with ServerProcess(
            url, env="tests.shm_close_in_flight_env:GatedEcho", num_envs=N, extra=extra
        ) as server:
            yield server.url, gate, server.proc.pid
    finally:
        for path in [gate, *glob.glob(gate + ".in-*")]:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _open(gate: str) -> None:
    with open(gate, "w"):
        pass


def interrupted(call: Callable[[], Any], send: Callable[[], None], after: float) -> float | None:
    """Run ``call`` with ``send()`` (a SIGINT) ``after`` seconds into it: the seconds from the
    signal to the KeyboardInterrupt, or None if ``call`` returned. A SIGINT after the call is
    ignored (never a KeyboardInterrupt into pytest)."""
    armed = True
    sent: list[float] = []

    def on_sigint(signum: int, frame: Any) -> None:
        if armed:
            raise KeyboardInterrupt

    def fire() -> None:
        sent.append(time.monotonic())
        send()

    previous = signal.signal(signal.SIGINT, on_sigint)
    timer = threading.Timer(after, fire)
    try:
        try:
            timer.start()
            try:
                call()
            finally:
                armed = False
        except KeyboardInterrupt:
            return time.monotonic() - sent[0]
        return None
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGINT, previous)


def to_process() -> None:
    """Ctrl-C: SIGINT to the process (the kernel gives it to the main thread, asleep in C)."""
    os.kill(os.getpid(), signal.SIGINT)


def to_this_thread() -> None:
    """SIGINT to the timer's own thread: its C handler runs there, and the main thread's sleep
    is not interrupted (only the periodic return to Python finds the pending handler)."""
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)


def _later(seconds: float, action: Callable[[], None]) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


@pytest.mark.parametrize("wait", ["balanced", "futex", "spin"])
@pytest.mark.parametrize("send", [to_process, to_this_thread], ids=["process", "thread"])
def test_ctrl_c_in_a_waiting_step_raises_at_once_and_the_next_step_is_its_own(
    gated: tuple[str, str, int], wait: str, send: Callable[[], None]
) -> None:
    url, gate, _ = gated
    with transport.connect(f"{url}&wait={wait}", timeout=30) as client:
        client.reset(seed=1)
        release = _later(RELEASE_S, lambda: _open(gate))
        try:
            took = interrupted(lambda: client.step(np.full(N, SLOW)), send, after=0.3)
            assert took is not None, "the step was not interrupted"
            assert took < BOUND_S, f"KeyboardInterrupt {took:.1f} s after the SIGINT"
            _open(gate)
            result = client.step(np.array([1, 2, 3, 4]))
            # this step's actions, and every env one step past the interrupted one
            assert result.observation[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
            assert result.observation[:, 1].tolist() == [2.0] * N
            assert client.step(np.array([5, 6, 7, 8])).observation[:, 1].tolist() == [3.0] * N
        finally:
            release.cancel()


def test_ctrl_c_with_no_timeout_and_a_stopped_server(gated: tuple[str, str, int]) -> None:
    url, gate, server_pid = gated
    _open(gate)  # no SLOW step here: the server is stopped instead
    with transport.connect(url, timeout=None) as client:
        client.reset(seed=1)
        os.kill(server_pid, signal.SIGSTOP)
        resume = _later(RELEASE_S, lambda: os.kill(server_pid, signal.SIGCONT))
        ctx: Any = client.channel._ctx  # type: ignore[attr-defined]
        slept = int(ctx.sleeps)

        def once_asleep() -> None:
            """SIGINT once the client sleeps on its published request (under load a fixed
            0.3 s could come before the request went out: then nothing was in flight)."""
            until = time.monotonic() + BOUND_S
            while int(ctx.sleeps) == slept and time.monotonic() < until:
                time.sleep(0.005)
            to_process()

        try:
            took = interrupted(lambda: client.step(np.array([1, 2, 3, 4])), once_asleep, after=0.1)
            assert took is not None, "the step was not interrupted"
            assert took < BOUND_S, f"KeyboardInterrupt {took:.1f} s after the SIGINT"
        finally:
            os.kill(server_pid, signal.SIGCONT)
            resume.cancel()
        result = client.step(np.array([9, 8, 7, 6]))
        assert result.observation[:, 0].tolist() == [9.0, 8.0, 7.0, 6.0]
        assert result.observation[:, 1].tolist() == [2.0] * N


@pytest.mark.parametrize("batch", [N, 1], ids=["every-env", "any-env"])
def test_ctrl_c_in_a_waiting_recv_keeps_the_envs_in_flight(
    gated: tuple[str, str, int], batch: int
) -> None:
    url, gate, _ = gated
    with transport.connect(url, timeout=30) as client:
        client.async_reset(seed=1)
        client.recv(N)
        ids = list(range(N)) if batch == N else [0, 1]
        client.send(np.full(len(ids), SLOW), ids)
        release = _later(RELEASE_S, lambda: _open(gate))
        try:
            took = interrupted(lambda: client.recv(batch), to_process, after=0.3)
            assert took is not None, "the recv was not interrupted"
            assert took < BOUND_S, f"KeyboardInterrupt {took:.1f} s after the SIGINT"
            _open(gate)
            got: list[int] = []
            while len(got) < len(ids):  # the envs stayed in flight: a later recv returns them
                got += client.recv(batch).env_ids.tolist()
            assert sorted(got) == ids
        finally:
            release.cancel()
