"""Vector envs others wrote, served as one ``VectorEnv`` (issue 24 item 1): a
``gymnasium.vector.VectorEnv`` (``GymVectorEnv``) and an EnvPool instance (``EnvPoolEnv``).

Each steps all its envs in one call and the runtime keeps the per-env rules in NumPy. Both
reset an env stepped after its episode ended themselves (gymnasium's NEXT_STEP auto-reset mode,
EnvPool's only one), so a NEXT_STEP client costs one call a step; SAME_STEP and DISABLED clients
get the runtime's rules, with the ended envs reset by a partial reset (gymnasium's
``options={"reset_mask": ...}``, EnvPool's ``reset(env_id)``), which also clears the env's own
pending auto-reset. The result fields are those ``transport.gym_schema`` derives from the
single env's spaces (``SCHEMA`` on each instance), gymnasium's ``info`` is not carried.

    serve(GymVectorEnv(gymnasium.make_vec("CartPole-v1", 64)), url, num_envs=64)
    serve(EnvPoolEnv(envpool.make_gymnasium("CartPole-v1", num_envs=64, seed=0)), url,
          num_envs=64)

``shm_layout="columns"`` derives the schema with the shm column layout: over shm:// both write
the region's columns directly (``writes_columns``), and a trainer reads each field of all N envs
as one contiguous block (docs/shm.md, "Column layout").

EnvPool and seeds: EnvPool takes its seed when it is made (env i gets ``seed + i``) and its
``reset`` takes none, so the seeds of a client's reset (and the server's ``seed=``) do not
reseed it: a seeded reset resets without reseeding. Its trajectories are EnvPool's own for the
seed it was made with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from transport.gym_schema import act_n_of, describe_spaces, schema_of_spaces
from transport.runtime.env import Spaces


class _Columns:
    """A single env's spaces as result columns: observation leaves, reward and both flags."""

    def __init__(self, observation_space: Any, action_space: Any, shm_layout: str) -> None:
        _, _, description = describe_spaces(observation_space, action_space)
        self.observation = description["observation"]
        self.action = description["action"]
        self.schema = schema_of_spaces(observation_space, action_space, shm_layout=shm_layout)
        self.spaces = Spaces(_obs_n(observation_space), act_n_of(action_space))
        self._views: tuple[np.ndarray, dict[str, np.ndarray]] | None = None

    def fields(self, out: np.ndarray) -> dict[str, np.ndarray]:
        """``out``'s field views by name, made once per result array (the runner hands the
        same rows every call; a structured array's field view costs ~0.4 us each)."""
        views = self._views
        if views is None or views[0] is not out:
            views = self._views = (out, {name: out[name] for name in out.dtype.names or ()})
        return views[1]

    def write_observation(self, value: Any, out: np.ndarray, rows: Any, take: Any = None) -> None:
        """Each leaf of a batched observation ``value`` (rows ``take`` of it; None: all) into
        the result rows ``rows`` (a slice or an index array)."""
        self._leaf(self.observation, value, self.fields(out), rows, take)

    def _leaf(
        self, desc: dict[str, Any], value: Any, fields: dict[str, np.ndarray], rows: Any, take: Any
    ) -> None:
        kind = desc["type"]
        if kind == "dict":
            for key, sub in desc["items"]:
                self._leaf(sub, value[key], fields, rows, take)
        elif kind == "tuple":
            for sub, item in zip(desc["items"], value, strict=True):
                self._leaf(sub, item, fields, rows, take)
        else:
            column = fields[desc["field"]]
            batch = np.asarray(value) if take is None else np.asarray(value)[take]
            column[rows] = batch.reshape((batch.shape[0], *column.shape[1:]))

    def actions(self, actions: np.ndarray) -> np.ndarray:
        """Wire actions (N, *shape) as the action space's batched values."""
        kind = self.action["type"]
        if kind == "discrete":
            return actions.reshape(actions.shape[0]).astype(np.int64)
        if kind == "multi_binary":
            return actions.astype(np.int8).reshape((actions.shape[0], *self.action["shape"]))
        dtype = np.dtype(self.action["dtype"])
        return actions.astype(dtype).reshape((actions.shape[0], *self.action["shape"]))


def _obs_n(space: Any) -> int:
    import gymnasium

    if isinstance(space, gymnasium.spaces.Dict):
        return sum(_obs_n(sub) for sub in space.spaces.values())
    if isinstance(space, gymnasium.spaces.Tuple):
        return sum(_obs_n(sub) for sub in space.spaces)
    return int(np.prod(space.shape or (1,)))


def _ended(fields: dict[str, np.ndarray], rows: Any) -> None:
    """A reset result: reward 0, both flags false."""
    fields["reward"][rows] = 0.0
    fields["terminated"][rows] = False
    fields["truncated"][rows] = False


def _stepped(
    fields: dict[str, np.ndarray], rows: Any, reward: Any, terminated: Any, truncated: Any
) -> None:
    fields["reward"][rows] = reward
    fields["terminated"][rows] = terminated
    fields["truncated"][rows] = truncated


class GymVectorEnv:
    """A ``gymnasium.vector.VectorEnv`` (NEXT_STEP auto-reset mode, gymnasium's default) as a
    ``VectorEnv``: its N envs step together (``steps_subsets`` False)."""

    steps_subsets = False
    writes_columns = True  # only out[field][rows] and out[rows] = records
    autoreset_next_step = True

    def __init__(self, env: Any, *, shm_layout: str = "slots") -> None:
        import gymnasium.vector
        from gymnasium.vector import AutoresetMode

        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        if AutoresetMode(mode) != AutoresetMode.NEXT_STEP:
            raise ValueError(
                f"GymVectorEnv needs a vector env in NEXT_STEP auto-reset mode (gymnasium's "
                f"default), not {AutoresetMode(mode).value}: the server applies every client's "
                "own mode"
            )
        self.env = env
        self.num_envs = int(env.num_envs)
        # an AsyncVectorEnv steps in worker processes: an shm server and client sleep meanwhile
        self.steps_on_own_threads = isinstance(env.unwrapped, gymnasium.vector.AsyncVectorEnv)
        self.columns = _Columns(env.single_observation_space, env.single_action_space, shm_layout)
        self.SCHEMA = self.columns.schema

    def spaces(self) -> Spaces:
        return self.columns.spaces

    def reset_envs(self, ids: np.ndarray, seeds: Sequence[int | None], out: np.ndarray) -> None:
        n = self.num_envs
        if ids.size == n:
            obs, _ = self.env.reset(seed=list(seeds))
            rows: Any = slice(None)
        else:
            every: list[int | None] = [None] * n
            for k, i in enumerate(ids.tolist()):
                every[i] = seeds[k]
            mask = np.zeros(n, dtype=bool)
            mask[ids] = True
            obs, _ = self.env.reset(seed=every, options={"reset_mask": mask})
            rows = ids
        self.columns.write_observation(obs, out, rows, rows)
        _ended(self.columns.fields(out), rows)

    def step_envs(self, actions: np.ndarray, ids: np.ndarray | None, out: np.ndarray) -> None:
        obs, reward, terminated, truncated, _ = self.env.step(self.columns.actions(actions))
        self.columns.write_observation(obs, out, slice(None))
        _stepped(self.columns.fields(out), slice(None), reward, terminated, truncated)

    def close(self) -> None:
        self.env.close()


def _native_action_dtype(pool: Any) -> np.dtype[Any]:
    """The dtype EnvPool's C++ side takes actions in (CartPole: int32, where the gymnasium
    space says int64): other dtypes are converted on every step (~50 us at 256 envs)."""
    try:
        native: np.dtype[Any] = np.dtype(pool.spec.action_array_spec["action"].dtype)
    except (AttributeError, KeyError, TypeError):
        native = np.dtype(pool.action_space.dtype)
    return native


class EnvPoolEnv:
    """An EnvPool instance (``envpool.make_gymnasium(...)``, synchronous: ``batch_size`` =
    ``num_envs``) as a ``VectorEnv``: any subset of its envs steps in one call, results placed
    by EnvPool's ``env_id``. See the module doc for seeds."""

    steps_subsets = True
    writes_columns = True  # only out[field][rows] and out[rows] = records
    autoreset_next_step = True
    steps_on_own_threads = True  # EnvPool's C++ threads: an shm server and client sleep

    def __init__(self, pool: Any, *, shm_layout: str = "slots") -> None:
        config = pool.config
        self.num_envs = int(config["num_envs"])
        if int(config.get("batch_size", self.num_envs) or self.num_envs) != self.num_envs:
            raise ValueError("EnvPoolEnv needs a synchronous EnvPool (batch_size == num_envs)")
        self.pool = pool
        self.columns = _Columns(pool.observation_space, pool.action_space, shm_layout)
        self.SCHEMA = self.columns.schema
        self._action = _native_action_dtype(pool)
        self._in_order = np.arange(self.num_envs, dtype=np.int32).tobytes()

    def spaces(self) -> Spaces:
        return self.columns.spaces

    def _rows(self, env_id: Any) -> np.ndarray | slice:
        """The result rows of EnvPool's ``env_id`` order: a slice when it is every env in order
        (a synchronous pool's usual answer), whose writes are plain copies, not scatters."""
        rows = np.asarray(env_id)
        if rows.dtype == np.int32 and rows.tobytes() == self._in_order:  # ~0.5 us at 256 envs
            return slice(None)
        return rows

    def reset_envs(self, ids: np.ndarray, seeds: Sequence[int | None], out: np.ndarray) -> None:
        if ids.size == self.num_envs:
            obs, info = self.pool.reset()
        else:
            obs, info = self.pool.reset(ids.astype(np.int32))
        rows = self._rows(info["env_id"])
        self.columns.write_observation(obs, out, rows)
        _ended(self.columns.fields(out), rows)

    def step_envs(self, actions: np.ndarray, ids: np.ndarray | None, out: np.ndarray) -> None:
        taken = self.columns.actions(actions if ids is None else actions[ids])
        env_id = None if ids is None else ids.astype(np.int32)
        obs, reward, terminated, truncated, info = self.pool.step(
            taken.astype(self._action, copy=False), env_id
        )
        rows = self._rows(info["env_id"])
        self.columns.write_observation(obs, out, rows)
        _stepped(self.columns.fields(out), rows, reward, terminated, truncated)

    def close(self) -> None:
        close = getattr(self.pool, "close", None)
        if close is not None:
            close()
