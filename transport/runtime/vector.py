"""The vector-env runner: one ``VectorEnv`` object steps all N envs of a client in one call
(issue 24 item 1). The third runner beside ``LocalEnvs`` and ``WorkerPool``.

The runtime's rules stay where they are (``EnvRuntime``: checks, seeds, masks, errors); this
runner keeps the per-env auto-reset vectorised in NumPy over the result rows:

- DISABLED: one ``step_envs(actions, None, rows)`` (the runtime refused done envs before).
- NEXT_STEP: the envs whose last result ended their episode are reset in one
  ``reset_envs(done_ids)`` and the others stepped in one ``step_envs(actions, others)``; an env
  with ``autoreset_next_step`` gets one ``step_envs(actions, None)`` and resets them itself.
- SAME_STEP: one ``step_envs``, then the ended rows are copied into ``finals`` at once and
  those envs reset in one ``reset_envs(ended_ids)``.

An exception from a call fails every env of that call; ``EnvRuntime`` then resets each
(``restore``) and answers one ENV_ERROR naming them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from transport.codec import StructCodec
from transport.protocol import AutoReset, ErrorCode, RequestError
from transport.runtime.core import FATE_FAILED, FATE_RESET, Failures, Runner
from transport.runtime.env import Columns, Spaces, awaited_text

_NEXT_STEP = AutoReset.NEXT_STEP
_SAME_STEP = AutoReset.SAME_STEP


class VectorEnvs(Runner):
    """A ``VectorEnv`` (``env``) whose N results land in ``results[:N]``."""

    def __init__(
        self,
        env: Any,
        codec: StructCodec,
        results: np.ndarray,
        finals: np.ndarray | None,
        action: np.dtype[Any],
        *,
        owned: bool = True,
    ) -> None:
        n = int(env.num_envs)
        super().__init__(codec, results, finals, n)
        self.env = env
        self.owned = owned  # made for this client (closed with it), not a shared instance
        self.rows = results[:n]
        self.subsets = bool(getattr(env, "steps_subsets", True))
        self.native_next_step = bool(getattr(env, "autoreset_next_step", False))
        self._all = np.arange(n, dtype=np.int64)
        self._n_shape = (n,)
        self._one_action = np.zeros((n, *action.shape), dtype=action.base)  # step_one's block
        self._names = frozenset(results.dtype.names or ())

    def spaces(self) -> Spaces:
        spaces: Spaces = self.env.spaces()
        return spaces

    # -- the env's two calls, with their outputs written --------------------------------------

    def _columns(self, ids: np.ndarray | None, columns: Columns) -> None:
        """Returned columns into the rows of ``ids`` (None: every row)."""
        if not hasattr(columns, "items"):
            awaited = awaited_text(columns)
            if awaited is not None:
                raise RequestError(ErrorCode.ENV_ERROR, awaited)
            raise TypeError(
                f"a vector env returns None (it wrote the rows) or a mapping of columns, "
                f"not {type(columns).__name__}"
            )
        for name, value in columns.items():
            if name not in self._names:
                raise ValueError(f"returned a column {name!r} the result has no field for")
            column = self.rows[name]
            if ids is None:
                column[...] = value
            else:
                column[ids] = value

    def _reset_ids(self, ids: np.ndarray, seeds: Sequence[int | None], failures: Failures) -> bool:
        try:
            out = self.env.reset_envs(ids, seeds, self.rows)
            if out is not None:
                self._columns(ids, out)
        except Exception as exc:  # every env of the call failed
            failures.extend((int(i), exc) for i in ids.tolist())
            return False
        return True

    def _step_ids(self, actions: np.ndarray, ids: np.ndarray | None, failures: Failures) -> None:
        if ids is not None and not self.subsets:
            raise RequestError(
                ErrorCode.BAD_BATCH,
                f"env {int(ids[0]) if ids.size else 0}: this vector env steps all its "
                f"{self.num_envs} envs together (steps_subsets is False)",
            )
        try:
            out = self.env.step_envs(actions, ids, self.rows)
            if out is not None:
                self._columns(ids, out)
        except Exception as exc:
            every = self._all if ids is None else ids
            failures.extend((int(i), exc) for i in every.tolist())

    # -- the Runner interface ---------------------------------------------------------------

    def reset(self, seeds: Sequence[int | None]) -> Failures:
        failures: Failures = []
        self._reset_ids(self._all, list(seeds[: self.num_envs]), failures)
        return failures

    def reset_one(self, index: int, seed: int | None) -> None:
        ids = np.array([index], dtype=np.int64)
        out = self.env.reset_envs(ids, [seed], self.rows)
        if out is not None:
            self._columns(ids, out)

    def step_env(self, index: int, action: Any) -> None:
        self._one_action[index] = action
        failures: Failures = []
        self._step_ids(self._one_action, np.array([index], dtype=np.int64), failures)
        if failures:
            raise failures[0][1]

    def step_one(self, index: int, action: Any, mode: AutoReset) -> bool:
        """One env alone (a 1-env server, an shm slot's own STEP): a batch with one env."""
        if self.num_envs == 1:
            ended, failures = self.step_except(np.asarray([action]), mode, None)
        else:
            self._one_action[index] = action
            skip = np.ones(self.num_envs, dtype=bool)
            skip[index] = False
            ended, failures = self.step_except(self._one_action, mode, skip)
        if failures:
            raise failures[0][1]
        return bool(ended)

    def step(
        self, actions: Sequence[int] | np.ndarray, mode: AutoReset
    ) -> tuple[list[int], Failures]:
        """Every env: ``step_except`` with no env skipped, its common case (an (N, ...) array
        of actions, no env to reset first, no finals to keep) as one ``step_envs`` call with
        nothing else done per request (issue 24: the socket paths' per-request work)."""
        if (
            mode == _SAME_STEP
            or type(actions) is not np.ndarray
            or actions.shape[:1] != self._n_shape
            or (mode == _NEXT_STEP and not self.native_next_step and self.ended() is not None)
        ):
            return self.step_except(actions, mode, None)
        failures: Failures = []
        self._step_ids(actions, None, failures)
        return [], failures

    def step_except(
        self, actions: Sequence[int] | np.ndarray, mode: AutoReset, skip: np.ndarray | None
    ) -> tuple[list[int], Failures]:
        """Step every env but those ``skip`` marks, auto-resetting as ``mode`` says (see the
        module doc): at most one ``reset_envs``, one ``step_envs`` and, for SAME_STEP, one more
        ``reset_envs`` per request."""
        n = self.num_envs
        block = np.asarray(actions)
        if block.shape[0] != n:
            block = block[:n]
        failures: Failures = []
        active = None if skip is None else ~skip[:n]
        if mode == _NEXT_STEP and not self.native_next_step:
            done = self.ended()
            if done is not None:
                self._reset_ids(np.flatnonzero(done), [None] * int(done.sum()), failures)
                active = ~done if active is None else active & ~done
        ids = None if active is None else np.flatnonzero(active)
        if ids is None or ids.size:
            self._step_ids(block, ids, failures)
        ended: list[int] = []
        if mode == _SAME_STEP:
            done = self.ended()
            if done is not None:
                if active is not None:
                    done &= active
                if failures:
                    done[[i for i, _ in failures]] = False
                if done.any():
                    ended = self.keep_finals(done)
                    ended_ids = np.array(ended, dtype=np.int64)
                    if not self._reset_ids(ended_ids, [None] * len(ended), failures):
                        ended = []
        if len(failures) > 1:
            failures.sort(key=lambda failure: failure[0])
        return ended, failures

    def restore(self, index: int, seed: int | None) -> tuple[str, bool]:
        """After env ``index`` failed: reset it alone (one env of a vector env cannot be
        recreated without the others)."""
        try:
            self.reset_one(index, seed)
        except Exception:
            return FATE_FAILED, False
        return FATE_RESET, True

    def observe_one(self, index: int) -> dict[str, Any]:
        return self.observe()[0][index]

    def observe(self) -> tuple[list[dict[str, Any]], Failures]:
        """The rows as they are, and the env's ``infos()`` (N maps) if it has one."""
        infos = getattr(self.env, "infos", None)
        if infos is None:
            return [{} for _ in range(self.num_envs)], []
        try:
            maps = [dict(info) for info in infos()]
            if len(maps) != self.num_envs:
                raise ValueError(f"infos() returned {len(maps)} maps for {self.num_envs} envs")
        except Exception as exc:
            return [{} for _ in range(self.num_envs)], [(0, exc)]
        return maps, []

    def write(self, index: int, output: Any) -> None:
        if output is not None:
            raise RequestError(ErrorCode.BAD_BATCH, "a vector env has no per-env outputs")

    def close(self) -> None:
        """Close the env if it was made for this client (a factory's), not a shared one."""
        if not self.owned:
            return
        close = getattr(self.env, "close", None)
        self.owned = False
        if close is not None:
            try:
                close()
            except Exception:
                pass
