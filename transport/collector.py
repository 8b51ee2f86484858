"""Episode collector (seed 001): B complete episodes as padded ``[B, K, ...]`` arrays.

``EpisodeCollector(client, policy_fn, max_len, seed=...)`` keeps the N envs of a ``Client`` (or a
``MultiClient``) busy with a job queue: job j is "play one episode"; an env that finishes its
episode takes the next job at once, so no env idles while a long episode finishes. A background
thread fills the next batch while the trainer holds the current one (double buffering).

Only the public client API is used (``reset`` with per-env seeds, ``step``), so the collector works
over every backend and server language. The client must be connected with
``autoreset="next_step"``: the step after an episode's end resets that env server-side.

Determinism: the envs are stepped in lock step, so which env runs which job is a function of the
episode lengths alone, never of wall-clock timing. Job j starts from seed ``seed + j`` when its
env has a connection of its own (a 1-env Client, or a MultiClient over 1-env servers: that env
is reset alone); on an N-env server only the first N jobs are seeded so (one RESET_SEEDS), and
later jobs on env i continue env i's own seeded stream, since the client API resets every env
of a server at once. The same seed, client shape and policy give the same EpisodeBatch bytes.

Observations are what the adapters return (``transport.spaces.observation_of``): one
observation field is an array of the field's shape, several (a gymnasium ``Dict`` space) are a
dict of them by field name, in field order; the collector keeps every field, with its shape.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from transport.actions import describe_action_space, describe_given
from transport.client import Client
from transport.errors import ActionError, AdapterError, TransportError
from transport.multi import MultiClient
from transport.protocol import body_codec
from transport.schema.ir import FieldIR
from transport.spaces import (
    Observation,
    action_field_of,
    gym_description_of,
    observation_of,
    observation_space_of,
)
from transport.step_view import StepView

PolicyFn = Callable[[Any, np.ndarray], Any]
"""``policy_fn(observations, env_ids[M]) -> actions[M, *action shape]``: called once per lock
step, batched over the M envs that are playing an episode, with their current observations
(``[M, *shape]``, or a dict of them by field name when the schema has several observation
fields). Any other shape is an ``ActionError`` naming it and the shape expected."""

Fields = dict[str, np.ndarray]
"""The collector's own form of observations: every observation field by name, in field order."""


@dataclass(frozen=True)
class EpisodeBatch:
    """B complete episodes, padded to K = the longest (at most ``max_len``) with zeros.

    Row b, step t < lengths[b]: ``observations[b, t]`` was seen, ``actions[b, t]`` taken,
    ``rewards[b, t]`` received (in the reward field's own float dtype, float64 for an f64
    reward, float32 for an f32 one; float64 when the field is not a float), as the server sent
    it; ``terminated``/``truncated`` flag the last step (``truncated`` is
    also set when the collector cut the episode at ``max_len``). ``final_observations[b]`` is the
    observation after the last step. ``seeds[b]`` is the episode's reset seed (-1: the env's own
    auto-reset stream continued). ``job_ids[b]`` is the job index (global across batches).
    Observations are ``[B, K, *field shape]``; with several observation fields,
    ``observations`` and ``final_observations`` are dicts of them by field name.
    """

    observations: Observation
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    lengths: np.ndarray
    final_observations: Observation
    seeds: np.ndarray
    job_ids: np.ndarray

    @property
    def mask(self) -> np.ndarray:
        """``[B, K]`` bool: True where a step is real, False in the padding."""
        steps = np.arange(self.rewards.shape[1])
        valid: np.ndarray = steps[None, :] < self.lengths[:, None]
        return valid

    def tobytes(self) -> bytes:
        """Every array's bytes in field order (an observation dict's in its field order): equal
        batches give equal bytes."""
        arrays: list[np.ndarray] = []
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            arrays.extend(value.values() if isinstance(value, dict) else [value])
        return b"".join(np.ascontiguousarray(array).tobytes() for array in arrays)


class _Episode:
    """One job's buffers (``max_len`` steps) while it is played."""

    def __init__(
        self,
        job: int,
        seed: int,
        max_len: int,
        obs: Fields,
        action: np.ndarray,
        reward_dtype: np.dtype[Any],
    ) -> None:
        self.job = job
        self.seed = seed
        self.length = 0
        self.observations = {
            name: np.zeros((max_len, *o.shape[1:]), dtype=o.dtype) for name, o in obs.items()
        }
        self.actions = np.zeros((max_len, *action.shape[1:]), dtype=action.dtype)
        self.rewards = np.zeros(max_len, dtype=reward_dtype)
        self.terminated = False
        self.truncated = False
        self.final_observation = {
            name: np.zeros(o.shape[1:], dtype=o.dtype) for name, o in obs.items()
        }


class EpisodeCollector:
    """Fills EpisodeBatches of ``batch_size`` episodes over the envs of ``client``.

    ``request_episodes()`` returns the next batch; the batch after it is filled meanwhile by a
    background thread: it pauses the lock step (all envs at once, which keeps the result
    independent of when the trainer asks) while ``max(1, prefetch)`` complete batches wait.
    Jobs of later batches start as soon as an env is free, so memory is bounded by the jobs
    that finish while the oldest incomplete one runs (at most N x max_len). ``max_len`` cuts an
    episode (``truncated``). An env with its own connection is then reset at once; on an N-env
    server (the client API resets every env of a server at once) the cut env keeps stepping
    with the policy until its episode ends, unrecorded, and ``drain_limit`` bounds that (an env
    that never ends is an AdapterError, not a hang).
    """

    def __init__(
        self,
        client: Client | MultiClient,
        policy_fn: PolicyFn,
        max_len: int,
        batch_size: int,
        *,
        seed: int = 0,
        prefetch: int = 1,
        drain_limit: int | None = None,
    ) -> None:
        mode = str(client.server_info.get("autoreset", "disabled")).lower()
        if mode not in ("next_step", "autoreset.next_step", "1"):
            raise AdapterError(
                f"{client.url}: the episode collector needs a client connected with "
                f"autoreset='next_step' (this one has {mode!r})"
            )
        if max_len < 1 or batch_size < 1 or prefetch < 0:
            raise ValueError("max_len and batch_size must be >= 1, prefetch >= 0")
        from transport.gym import ResultFields

        self.client = client
        self.policy_fn = policy_fn
        self.max_len = max_len
        self.batch_size = batch_size
        self.seed = seed
        self.prefetch = prefetch
        self.drain_limit = 10 * max_len if drain_limit is None else drain_limit
        self.fields = ResultFields(client)  # type: ignore[arg-type]  # a MultiClient has .schema
        self._observation_fields: tuple[FieldIR, ...] = self.fields.observations
        # the adapters' shapes: a schema derived from gymnasium spaces gives each field the
        # space's own shape (a Discrete leaf: no axis of its own), as RemoteVectorEnv does;
        # observation_space_of tells observation_of the spaces' structure
        described = gym_description_of(client.schema)
        self._structure = described["observation"] if described is not None else None
        if described is not None:
            observation_space_of(client.schema)
        self._action = action_field_of(client.schema)
        self._reward_dtype = reward_dtype_of(
            body_codec(client.schema, "RESET_RESP").dtype[self.fields.reward]
        )
        self.num_envs = int(client.num_envs)
        self._cond = threading.Condition()
        self._done: dict[int, _Episode] = {}  # finished jobs not yet handed out
        self._next_batch = 0  # the batch request_episodes returns next
        self._filled: dict[int, int] = {}  # batch -> finished jobs (incomplete batches)
        self._completed = 0  # batches 0 .. _completed - 1 are complete
        self._error: BaseException | None = None
        self._stop = False
        self._thread: threading.Thread | None = None

    # -- the trainer's side --------------------------------------------------------------------

    def request_episodes(self, timeout: float | None = None) -> EpisodeBatch:
        """The next batch of ``batch_size`` complete episodes (blocks until it is full)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="episode-collector", daemon=True)
            self._thread.start()
        first = self._next_batch * self.batch_size
        jobs = range(first, first + self.batch_size)
        with self._cond:
            ready = self._cond.wait_for(
                lambda: self._error is not None or all(j in self._done for j in jobs), timeout
            )
            if self._error is not None:
                raise self._error
            if not ready:
                raise TimeoutError(f"batch {self._next_batch} not full within {timeout} s")
            episodes = [self._done.pop(j) for j in jobs]
            self._next_batch += 1
            self._cond.notify_all()  # the producer may start the jobs of one more batch
        return _stack(episodes)

    def batches_ready(self) -> int:
        """How many batches after the one last returned are already complete."""
        with self._cond:
            count, start = 0, self._next_batch * self.batch_size
            while all(j in self._done for j in range(start, start + self.batch_size)):
                count, start = count + 1, start + self.batch_size
            return count

    def close(self) -> None:
        """Stop the background thread (the client stays open: the caller owns it)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def __enter__(self) -> EpisodeCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the producer --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:  # handed to the trainer by request_episodes
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _paused(self) -> bool:
        """Backpressure: stop stepping (every env at once, so the result stays independent of
        timing) while ``max(1, prefetch)`` complete batches wait for the trainer."""
        return self._completed - self._next_batch >= max(1, self.prefetch)

    def _solo_clients(self) -> list[Client | None]:
        """Per env: its own 1-env connection when it has one (a 1-env Client, or a
        MultiClient's 1-env server), which can reset it alone with its job's seed."""
        client = self.client
        if isinstance(client, Client):
            return [client] if client.num_envs == 1 else [None] * client.num_envs
        solo: list[Client | None] = [None] * self.num_envs
        for part in client.parts:
            if part.client.num_envs == 1:
                solo[part.env_ids.start] = part.client
        return solo

    def _reset_alone(self, client: Client, seed: int, obs: Fields, index: int) -> None:
        """Reset one env with its job's seed; its first observation goes to row ``index``."""
        first = self._fields_of(client.reset(seed), 1)
        for name, rows in obs.items():
            rows[index] = first[name][0]

    def _produce(self) -> None:
        n = self.num_envs
        solo = self._solo_clients()
        seeds = [self.seed + j for j in range(n)]
        view = self.client.reset(seeds)
        obs = self._obs(view)
        action_template = np.zeros((n, *self._action.dims), dtype=self._action_dtype())
        running: list[_Episode | None] = [None] * n
        draining = np.zeros(n, dtype=np.int64)  # > 0: cut at max_len, steps spent finishing
        resetting = np.zeros(n, dtype=bool)  # ended: this step resets it (action ignored)
        next_job = 0
        for i in range(n):
            running[i] = _Episode(
                i, seeds[i], self.max_len, obs, action_template, self._reward_dtype
            )
            next_job += 1
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or not self._paused())
                if self._stop:
                    return
            # hand out jobs to free envs at once, in env order (deterministic): a free env is
            # never parked, since a lock step would step it anyway
            for i in range(n):
                if running[i] is None and draining[i] == 0 and not resetting[i]:
                    alone = solo[i]
                    seed = -1
                    if alone is not None:  # every job's seed is its index: seed + job
                        seed = self.seed + next_job
                        self._reset_alone(alone, seed, obs, i)
                    running[i] = _Episode(
                        next_job, seed, self.max_len, obs, action_template, self._reward_dtype
                    )
                    next_job += 1
            playing = np.array(
                [i for i in range(n) if not resetting[i]],
                dtype=np.int64,
            )
            actions = action_template.copy()
            if len(playing):
                current = _public({name: rows[playing] for name, rows in obs.items()})
                chosen = self._policy_actions(self.policy_fn(current, playing.copy()), playing)
                if chosen.dtype != actions.dtype:  # the client's action rule judges the values:
                    wider = np.result_type(chosen.dtype, actions.dtype)  # floats for integers
                    actions = actions.astype(wider)  # are refused, not truncated
                actions[playing] = chosen
            for i in playing.tolist():
                episode = running[i]
                if episode is not None:
                    for name, rows in obs.items():
                        episode.observations[name][episode.length] = rows[i]
                    episode.actions[episode.length] = actions[i]
            view = self.client.step(actions)  # (n, *action shape): one action per env
            obs = self._obs(view)
            rewards = np.asarray(view[self.fields.reward], dtype=self._reward_dtype).reshape(n)
            terminated = self.fields.terminated_of(view).reshape(n)
            truncated = self.fields.truncated_of(view).reshape(n)
            finished: list[_Episode] = []
            for i in range(n):
                if resetting[i]:
                    resetting[i] = False  # this step was its reset: obs is the new episode's
                    continue
                ended = bool(terminated[i] or truncated[i])
                episode = running[i]
                if episode is None:
                    if draining[i]:
                        draining[i] = 0 if ended else draining[i] + 1
                        resetting[i] = ended
                        if draining[i] > self.drain_limit:
                            raise AdapterError(
                                f"{self.client.url}: env {i} did not end its episode within "
                                f"{self.drain_limit} steps after the collector cut it at "
                                f"max_len={self.max_len}"
                            )
                    continue
                episode.rewards[episode.length] = rewards[i]
                episode.length += 1
                if ended or episode.length == self.max_len:
                    episode.terminated = bool(terminated[i])
                    episode.truncated = bool(truncated[i]) or not ended
                    for name, rows in obs.items():
                        episode.final_observation[name][...] = rows[i]
                    finished.append(episode)
                    running[i] = None
                    resetting[i] = ended and solo[i] is None  # else reset alone, seeded
                    draining[i] = 0 if ended or solo[i] is not None else 1
            if finished:
                with self._cond:
                    for episode in finished:
                        self._done[episode.job] = episode
                        batch = episode.job // self.batch_size
                        self._filled[batch] = self._filled.get(batch, 0) + 1
                    while self._filled.get(self._completed, 0) == self.batch_size:
                        del self._filled[self._completed]
                        self._completed += 1
                    self._cond.notify_all()

    def _policy_actions(self, output: Any, playing: np.ndarray) -> np.ndarray:
        """The policy's output as an array of one action per playing env, shape
        ``(M, *action shape)`` (the client's rule for a batch, docs/client.md "Actions"); any
        other shape is an ``ActionError`` naming what it returned and what was expected (never
        reshaped: a wrong count, or actions laid out another way, would step the wrong envs)."""
        want = (len(playing), *self._action.dims)
        try:
            chosen = np.asarray(output)
        except (ValueError, TypeError):
            chosen = None
        if chosen is not None and chosen.shape == want and chosen.dtype != object:
            return chosen
        ids = playing.tolist()
        shown = ids if len(ids) <= 8 else [*ids[:8], "..."]
        try:
            act_n: int | None = None if self._action.dims else self.client.spaces().act_n
        except TransportError:
            act_n = None
        raise ActionError(
            f"policy_fn returned {describe_given(output)} for {len(ids)} env"
            f"{'' if len(ids) == 1 else 's'} (env ids {shown}): expected one action per env, "
            f"an array of shape {want!r} for {describe_action_space(self.client.schema, act_n)}"
        )

    def _obs(self, view: StepView) -> Fields:
        """Every env's observation fields: copies (the view is overwritten by the next request)."""
        return self._fields_of(view, self.num_envs)

    def _fields_of(self, view: StepView, count: int) -> Fields:
        """Every observation field of ``view``'s ``count`` envs, ``[count, *field shape]``: the
        adapters' rule (``observation_of``), kept as a dict even for one field."""
        found = observation_of(view, self._observation_fields, count)
        if self._structure is not None:  # the spaces' structure (Dict, Tuple): its leaves
            leaves: Fields = {}
            _leaves_of(self._structure, found, leaves)
            return {f.name: leaves[f.name] for f in self._observation_fields}
        if isinstance(found, dict):
            return found
        return {self._observation_fields[0].name: found}

    def _action_dtype(self) -> np.dtype[Any]:
        dtype: np.dtype[Any] = self.client.action_dtype
        return dtype


def reward_dtype_of(field: np.dtype[Any]) -> np.dtype[Any]:
    """The dtype of an EpisodeBatch's rewards for a reward field of dtype ``field``: the field's
    own float type (native byte order), so the rewards are the values the server sent; float64
    for a field that is not a float (an integer reward), as the adapters return rewards."""
    base = np.dtype(field).base
    if base.kind == "f":
        return base.newbyteorder("=")
    return np.dtype(np.float64)


def _leaves_of(desc: dict[str, Any], value: Any, out: Fields) -> None:
    """The field arrays of an observation in a gymnasium space's structure, by field name."""
    kind = desc["type"]
    if kind == "dict":
        for key, sub in desc["items"]:
            _leaves_of(sub, value[str(key)], out)
    elif kind == "tuple":
        for sub, item in zip(desc["items"], value, strict=True):
            _leaves_of(sub, item, out)
    else:
        out[desc["field"]] = value


def _public(fields: Fields) -> Observation:
    """What the policy and the batches show: the one field's array, or the dict of several."""
    return next(iter(fields.values())) if len(fields) == 1 else fields


def _stack(episodes: list[_Episode]) -> EpisodeBatch:
    """Pad the episodes to the longest and stack them: ``[B, K, ...]``."""
    k = max(e.length for e in episodes)
    b = len(episodes)
    first = episodes[0]
    obs = {
        name: np.zeros((b, k, *rows.shape[1:]), dtype=rows.dtype)
        for name, rows in first.observations.items()
    }
    actions = np.zeros((b, k, *first.actions.shape[1:]), dtype=first.actions.dtype)
    rewards = np.zeros((b, k), dtype=first.rewards.dtype)
    terminated = np.zeros((b, k), dtype=bool)
    truncated = np.zeros((b, k), dtype=bool)
    for row, e in enumerate(episodes):
        for name, rows in obs.items():
            rows[row, : e.length] = e.observations[name][: e.length]
        actions[row, : e.length] = e.actions[: e.length]
        rewards[row, : e.length] = e.rewards[: e.length]
        terminated[row, e.length - 1] = e.terminated
        truncated[row, e.length - 1] = e.truncated
    return EpisodeBatch(
        observations=_public(obs),
        actions=actions,
        rewards=rewards,
        terminated=terminated,
        truncated=truncated,
        lengths=np.array([e.length for e in episodes], dtype=np.int64),
        final_observations=_public(
            {name: np.stack([e.final_observation[name] for e in episodes]) for name in obs}
        ),
        seeds=np.array([e.seed for e in episodes], dtype=np.int64),
        job_ids=np.array([e.job for e in episodes], dtype=np.int64),
    )


def request_episodes(
    client: Client | MultiClient,
    batch_size: int,
    policy_fn: PolicyFn,
    max_len: int,
    *,
    seed: int = 0,
) -> EpisodeBatch:
    """One batch of ``batch_size`` complete episodes (a one-shot EpisodeCollector, no prefetch)."""
    with EpisodeCollector(client, policy_fn, max_len, batch_size, seed=seed, prefetch=0) as c:
        return c.request_episodes()
