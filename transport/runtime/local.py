"""The in-process runner: envs stepped in the calling thread, results written in place.

``results`` rows may be any record views with the codec's field names: a packed response
buffer (stream servers: outputs are encoded straight into it) or the slots of an shm region
(strided: outputs are encoded once into a scratch record and assigned). Envs with
``step_into``/``reset_into`` write into the row themselves: zero copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from transport.codec import StructCodec, row_bytes
from transport.runtime.core import (
    FATE_FAILED,
    FATE_RECREATED,
    FATE_RESET,
    Failures,
    Runner,
    StepBatch,
    write_result,
)
from transport.runtime.env import Env, Spaces, StepOutput, close_env


class LocalEnvs(Runner):
    """``envs`` stepped in this thread; env i's result in ``results[i]``."""

    def __init__(
        self,
        envs: list[Env],
        codec: StructCodec,
        results: np.ndarray,
        finals: np.ndarray | None,
        factory: Callable[[], Env] | None,
        *,
        base: int = 0,
    ) -> None:
        super().__init__(codec, results, finals, len(envs), base=base)
        self.envs = envs
        self.factory = factory
        self._closed = False
        self._scratch = bytearray(codec.size)
        self._scratch_record = codec.view(self._scratch)
        # rows laid out exactly as the codec (a packed buffer): encode straight into them
        packed = results.dtype == codec.dtype and results.strides == (codec.size,)
        self._row_bytes: list[memoryview] | None = (
            [results[i : i + 1].view(np.uint8).data for i in range(results.shape[0])]
            if packed
            else None
        )
        self._bytes: np.ndarray | None = None  # row_bytes(results), made when first needed
        # env index by id of its record (held in self.records: the ids stay theirs)
        self._index = {id(record): i for i, record in enumerate(self.records)}
        self._refresh()

    def _refresh(self) -> None:
        self._step_into = [getattr(env, "step_into", None) for env in self.envs]
        self._reset_into = [getattr(env, "reset_into", None) for env in self.envs]
        # each env's step as one callable of (action, record): step_into, else a wrapper of
        # step that returns its output (written after the loop, records all at once)
        self._steppers = [
            into if into is not None else _outputs(env.step)
            for env, into in zip(self.envs, self._step_into, strict=True)
        ]

    def spaces(self) -> Spaces:
        return self.envs[0].spaces()

    def write(self, index: int, output: StepOutput | None) -> None:
        if output is None:  # the env wrote the record in place (step_into / reset_into)
            return
        if self._row_bytes is not None:
            write_result(self.codec, self.base + index, output, self._row_bytes[index], 0)
            return
        write_result(self.codec, self.base + index, output, self._scratch, 0)
        self.records[index][...] = self._scratch_record

    def reset_one(self, index: int, seed: int | None) -> None:
        reset_into = self._reset_into[index]
        if reset_into is not None:
            self.write(index, reset_into(seed, self.records[index]))
        else:
            self.write(index, self.envs[index].reset(seed))

    def step_env(self, index: int, action: int) -> None:
        step_into = self._step_into[index]
        if step_into is not None:
            self.write(index, step_into(action, self.records[index]))
        else:
            self.write(index, self.envs[index].step(action))

    def _calls(
        self, ids: list[int] | None, values: Sequence[Any]
    ) -> Iterator[tuple[int, Any, Any, Any]]:
        """(env index, its step callable, its action, its record) of every env stepped."""
        steppers, records = self._steppers, self.records
        if ids is None:
            return zip(range(self.num_envs), steppers, values, records, strict=False)
        return ((i, steppers[i], values[i], records[i]) for i in ids)

    def step_many(self, ids: list[int] | None, values: Sequence[Any], failures: Failures) -> None:
        """The hot loop (issue 24 item 2): each env's ``step_into(action, record)`` (or
        ``step(action)``) called in one tight loop; outputs that are records of the codec's dtype
        are written after it in one vectorised assignment, other outputs (mappings, validated)
        env by env.

        Every env (``ids`` None, the common case) is stepped by a loop over (step, action,
        record) alone: the index of an env that returned an output or raised is looked up by
        its record (``_index``), never counted in the loop."""
        if ids is not None:
            self._step_ids(ids, values, failures)
            return
        outputs: list[tuple[int, StepOutput]] = []
        index = self._index
        steps = zip(self._steppers, values, self.records, strict=False)  # records: R >= N rows
        while True:
            try:
                for stepper, action, record in steps:
                    output = stepper(action, record)
                    if output is not None:
                        outputs.append((index[id(record)], output))
                break
            except Exception as exc:  # the other envs still step: the loop goes on after it
                failures.append((index[id(record)], exc))
        if outputs:
            self._write_outputs(outputs, failures)

    def _step_ids(self, ids: list[int], values: Sequence[Any], failures: Failures) -> None:
        """``step_many`` of the envs ``ids`` (a subset: the others are skipped or reset)."""
        outputs: list[tuple[int, StepOutput]] = []
        for i, stepper, action, record in self._calls(ids, values):
            try:
                output = stepper(action, record)
            except Exception as exc:  # the other envs still step
                failures.append((i, exc))
                continue
            if output is not None:
                outputs.append((i, output))
        if outputs:
            self._write_outputs(outputs, failures)

    def step_same(
        self, ids: list[int] | None, values: Sequence[Any], failures: Failures
    ) -> list[int]:
        """SAME_STEP's loop (``Runner.step_same``, the same order and outcome) without a call
        per env beyond its own step: the env's ``step_into`` (or ``step``, its output written
        at once), then its end fields read through memoryviews; an env that ended has its
        final result kept and is reset before the next env steps."""
        ends = self._end_items
        ended: list[int] = []
        for i, stepper, action, record in self._calls(ids, values):
            try:
                output = stepper(action, record)
                if output is not None:
                    self.write(i, output)
                for end in ends:
                    if end[i]:
                        break
                else:
                    continue
                self.final_records[i][...] = record
                self.reset_one(i, None)
                ended.append(i)
            except Exception as exc:  # the other envs still step
                failures.append((i, exc))
        return ended

    def _write_outputs(self, outputs: list[tuple[int, StepOutput]], failures: Failures) -> None:
        """Envs' outputs into their rows: records of the codec's dtype in one assignment
        (NaNs canonicalised and padding zeroed once for all of them), the rest one by one."""
        dtype = self.codec.dtype
        records = [
            (i, out)
            for i, out in outputs
            if isinstance(out, np.ndarray | np.void) and out.dtype == dtype and out.ndim == 0
        ]
        if len(records) > 1:
            ids = [i for i, _ in records]
            block = np.array([out for _, out in records], dtype=dtype)
            self.codec.canonicalize(block)
            raw = block.view(np.uint8).reshape(len(ids), -1)
            padding: np.ndarray | None = getattr(self.codec, "_padding", None)  # codec.py
            if padding is not None:
                raw[:, padding] = 0
            if self.results.dtype != dtype:  # other field offsets (an shm slot profile)
                self.results[ids] = block
            else:
                if self._bytes is None:
                    self._bytes = row_bytes(self.results)
                if ids[-1] - ids[0] == len(ids) - 1:  # a run of rows: one slice assignment
                    self._bytes[ids[0] : ids[-1] + 1] = raw
                else:
                    self._bytes[ids] = raw
            if len(records) == len(outputs):
                return
            done = set(ids)
            outputs = [(i, out) for i, out in outputs if i not in done]
        for i, out in outputs:
            try:
                self.write(i, out)
            except Exception as exc:
                failures.append((i, exc))

    def observe_one(self, index: int) -> dict[str, Any]:
        env = self.envs[index]
        observe = getattr(env, "observe", None)
        if observe is not None:
            self.write(index, observe())
        info = getattr(env, "info", None)
        return dict(info()) if info is not None else {}

    def step_batch(self) -> StepBatch | None:
        return getattr(self.envs[0], "step_batch", None) if self.num_envs == 1 else None

    def restore(self, index: int, seed: int | None) -> tuple[str, bool]:
        env = self.envs[index]
        attempts: list[tuple[str, Callable[[], Env]]] = [(FATE_RESET, lambda: env)]
        if self.factory is not None:
            attempts.append((FATE_RECREATED, self.factory))
        for fate, make in attempts:
            try:
                fresh = make()
                old = self.envs[index]
                if fresh is not old:  # the broken env is let go of: closed, not left to the GC
                    self.envs[index] = fresh
                    self._refresh()
                    close_env(old)
                self.reset_one(index, seed)
            except Exception:
                continue
            return fate, True
        return FATE_FAILED, False

    def close(self) -> None:
        """The client left: the envs the factory made for it are closed, as a vector env the
        server made is; a shared env is not (the next client steps it)."""
        if self.factory is not None and not self._closed:
            self._closed = True
            self.close_envs()

    def close_envs(self) -> None:
        """Call each env's ``close()`` (a session's own envs; a worker process's, at shutdown)."""
        for env in self.envs:
            close_env(env)


def _outputs(step: Callable[[Any], StepOutput]) -> Callable[[Any, Any], StepOutput]:
    """An env's ``step(action)`` as a ``(action, record)`` callable (the record unused)."""

    def call(action: Any, record: Any) -> StepOutput:
        return step(action)

    return call
