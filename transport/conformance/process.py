"""Running a testee program: one child process, framed msgpack on its stdin and stdout."""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from transport.conformance import wire

_STDERR_KEEP = 64 * 1024
T = TypeVar("T")


class TesteeStartError(Exception):
    """The testee could not be started or did not answer ``hello``."""


class TesteeError(Exception):
    """The testee died, timed out or broke the protocol in the middle of a run."""


class TesteeProcess:
    """A running testee; ``request`` sends one frame and waits for its answer."""

    def __init__(self, argv: Sequence[str], timeout: float = 120.0, cwd: str | None = None):
        self.argv = list(argv)
        self.timeout = timeout
        self._responses: queue.Queue[tuple[bool, Any]] = queue.Queue()
        self._stderr = bytearray()
        self._stderr_lock = threading.Lock()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        except OSError as exc:
            raise TesteeStartError(f"cannot run {' '.join(self.argv)}: {exc}") from exc
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.lang = "?"
        self.schemas: list[str] = []
        try:
            hello = self.request({"op": "hello"})
        except TesteeError as exc:
            self.kill()
            raise TesteeStartError(str(exc)) from exc
        if not isinstance(hello, dict) or not hello.get("ok"):
            self.kill()
            raise TesteeStartError(f"testee answered hello with {hello!r}")
        self.lang = str(hello.get("lang", "?"))
        if self.lang == "python":  # the runner's own side is "python": keep the labels apart
            self.lang = "python-testee"
        self.schemas = [str(s) for s in hello.get("schemas", [])]

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        try:
            while True:
                message = wire.read_frame(self.proc.stdout)
                if message is None:
                    self._responses.put((False, "the testee closed its stdout"))
                    return
                self._responses.put((True, message))
        except Exception as exc:
            self._responses.put((False, f"unreadable response: {exc}"))

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        stream = self.proc.stderr
        for chunk in iter(lambda: stream.read1(4096), b""):  # type: ignore[attr-defined]
            with self._stderr_lock:
                self._stderr += chunk
                del self._stderr[:-_STDERR_KEEP]

    def stderr_tail(self, lines: int = 20) -> str:
        with self._stderr_lock:
            text = self._stderr.decode("utf-8", "replace")
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def _failure(self, what: str) -> TesteeError:
        code = self.proc.poll()
        status = f" (exit status {code})" if code is not None else ""
        tail = self.stderr_tail()
        more = f"\n--- testee stderr (last lines) ---\n{tail}" if tail else ""
        return TesteeError(f"{what}{status}{more}")

    def send(self, request: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(wire.frame(request))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise self._failure(f"cannot write to the testee: {exc}") from exc

    def receive(self) -> Any:
        try:
            ok, message = self._responses.get(timeout=self.timeout)
        except queue.Empty:
            raise self._failure(f"no answer from the testee within {self.timeout:g} s") from None
        if not ok:
            self._responses.put((ok, message))  # later calls fail the same way
            raise self._failure(str(message))
        return message

    def request(self, request: dict[str, Any]) -> Any:
        self.send(request)
        return self.receive()

    def pipeline(
        self, requests: Iterable[tuple[T, dict[str, Any]]], window: int = 2
    ) -> Iterator[tuple[T, Any]]:
        """Send ``(tag, request)`` pairs up to ``window`` ahead; yield ``(tag, response)``."""
        pending: deque[T] = deque()
        for tag, request in requests:
            self.send(request)
            pending.append(tag)
            if len(pending) >= window:
                yield pending.popleft(), self.receive()
        while pending:
            yield pending.popleft(), self.receive()

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(TesteeError):
                self.send({"op": "exit"})
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
