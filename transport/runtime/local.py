"""The in-process runner: envs stepped in the calling thread, results written in place.

``results`` rows may be any record views with the codec's field names: a packed response
buffer (stream servers: outputs are encoded straight into it) or the slots of an shm region
(strided: outputs are encoded once into a scratch record and assigned). Envs with
``step_into``/``reset_into`` write into the row themselves: zero copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from transport.codec import StructCodec
from transport.runtime.core import (
    FATE_FAILED,
    FATE_RECREATED,
    FATE_RESET,
    Runner,
    StepBatch,
    write_result,
)
from transport.runtime.env import Env, Spaces, StepOutput


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
        self._scratch = bytearray(codec.size)
        self._scratch_record = codec.view(self._scratch)
        # rows laid out exactly as the codec (a packed buffer): encode straight into them
        packed = results.dtype == codec.dtype and results.strides == (codec.size,)
        self._row_bytes: list[memoryview] | None = (
            [results[i : i + 1].view(np.uint8).data for i in range(results.shape[0])]
            if packed
            else None
        )
        self._refresh()

    def _refresh(self) -> None:
        self._step_into = [getattr(env, "step_into", None) for env in self.envs]
        self._reset_into = [getattr(env, "reset_into", None) for env in self.envs]

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
                self.envs[index] = fresh
                self._refresh()
                self.reset_one(index, seed)
            except Exception:
                continue
            return fate, True
        return FATE_FAILED, False

    def close_envs(self) -> None:
        """Call each env's ``close()`` (a worker process that owns its envs, at shutdown)."""
        for env in self.envs:
            close = getattr(env, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:
                    pass
