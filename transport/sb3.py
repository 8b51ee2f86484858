"""Stable-Baselines3 adapter: ``RemoteVecEnv``, N remote envs over one connection as a ``VecEnv``.

Install with ``pip install transport[sb3]``. Same-step auto-reset on the server (SB3's contract):
the step that ends an episode returns the reset observation, ``done=True``, the final reward,
and ``infos[i]["terminal_observation"]`` (the final observation, from ``client.finals``);
``infos[i]["TimeLimit.truncated"]`` is True when the episode was truncated, not terminated.
``action_masks()`` and ``env_method("action_masks")`` give sb3-contrib's MaskablePPO the masks.

``on_env_error="truncate"`` keeps ``learn()`` going when a remote env raises: that env's
episode ends as truncated (see ``RemoteVecEnv``) and the error is logged; the default
``"raise"`` lets the ``EnvError`` through.

Observations are copies (SB3 stores them in rollout buffers); use the ``Client`` for zero copy.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import gymnasium
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from transport.api import connect
from transport.client import DEFAULT_TIMEOUT, Client
from transport.codec import Schema
from transport.errors import EnvError, NoProgressError
from transport.gym import (
    Bounds,
    ResultFields,
    check_autoreset,
    check_no_progress,
    check_num_envs,
    observation_bounds_of,
    resolve_num_envs,
    resolve_url,
    step_explained,
)
from transport.spaces import (
    action_field_of,
    action_space_of,
    actions_of,
    observation_of,
    observation_space_of,
)

log = logging.getLogger("transport.sb3")

OnEnvError = Literal["raise", "truncate"]
_FAILED_ENV = re.compile(r"(?:^|; )env (\d+): ")
"""Each env an ENV_ERROR text names (``env {i}: ...`` joined by ``; ``)."""


class RemoteVecEnv(VecEnv):
    """An SB3 ``VecEnv`` over one connection: one batched message per ``step_wait``.

    ``num_envs`` must match the server's number of envs (None: ``$TRANSPORT_NUM_ENVS`` or the
    server's). ``seed(s)`` makes the next ``reset()`` give env i the seed s + i. Attributes set
    with ``set_attr`` live on this side, per env index (there is no remote env object).

    ``on_env_error``: what ``step_wait`` does when a remote env raises (``EnvError``; the
    server has reset that env). ``"raise"`` (default): the error goes to the caller.
    ``"truncate"``: the step returns every env's current result (one OBSERVE request), and each
    env that raised ends its episode as truncated: ``done=True``, reward 0, its terminal
    observation is the reset observation, ``infos[i]["TimeLimit.truncated"] = True`` and
    ``infos[i]["env_error"]`` the server's message; the error is logged (``transport.sb3``) and
    training goes on. The other envs' results are those of the step, except that an episode
    another env ended in that very step shows only its reset observation (its final result was
    in the lost response). An env the server could not reset raises anyway.
    """

    def __init__(
        self,
        url: str | None = None,
        num_envs: int | None = None,
        *,
        schema: Schema | str | Path | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        observation_bounds: Bounds | None = None,
        client: Client | None = None,
        on_env_error: OnEnvError = "raise",
        on_no_progress: OnEnvError = "raise",
    ) -> None:
        """``client``: drive this client (connected with ``autoreset="same_step"``) instead of
        connecting to ``url``; the VecEnv closes it."""
        if on_env_error not in ("raise", "truncate"):
            raise ValueError(f"on_env_error must be 'raise' or 'truncate', not {on_env_error!r}")
        self.on_env_error: OnEnvError = on_env_error
        # a stalled env (NoProgressError, decision-boundary runs): "truncate" as on_env_error's
        self.on_no_progress: OnEnvError = check_no_progress(on_no_progress)  # type: ignore[assignment]
        if client is None:
            client = connect(resolve_url(url), schema, timeout=timeout, autoreset="same_step")
        else:
            check_autoreset(client, "same_step")  # before the VecEnv owns (and would close) it
        self.client = client
        try:
            n = check_num_envs(self.client, resolve_num_envs(num_envs))
            self.fields = ResultFields(self.client)
            space = self.client.spaces()
            bounds = observation_bounds_of(self.client, observation_bounds)
        except BaseException:
            self.client.close()
            raise
        observation_space = observation_space_of(self.client.schema, bounds)
        self._action = action_field_of(self.client.schema)
        self._actions: np.ndarray | None = None
        self._masks = np.ones((n, space.act_n), dtype=bool)
        self._attrs: dict[str, list[Any]] = {}
        self._closed = False
        super().__init__(n, observation_space, action_space_of(self.client.schema, space.act_n))

    # -- the VecEnv API ------------------------------------------------------------------------

    def reset(self) -> VecEnvObs:
        seeds = self._seeds
        seed = seeds[0] if seeds and seeds[0] is not None else None
        if seed is not None and any(s != seed + i for i, s in enumerate(seeds)):
            raise ValueError(f"the server seeds env i with seed + i; got seeds {seeds}")
        view = self.client.reset(seed)
        self._reset_seeds()
        self._reset_options()
        self.reset_infos = [self._info(view, i) for i in range(self.num_envs)]
        return self._observe(view)

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions_of(actions, self._action, self.num_envs)

    def step_wait(self) -> VecEnvStepReturn:
        if self._actions is None:
            raise RuntimeError("step_wait() without step_async()")
        actions, self._actions = self._actions, None
        try:
            view = step_explained(self.client, actions)
        except EnvError as exc:
            stalled = isinstance(exc, NoProgressError) and self.on_no_progress == "truncate"
            if self.on_env_error == "raise" and not stalled:
                raise
            return self._truncate_failed(exc)
        fields = self.fields
        rewards = np.array(view[fields.reward], dtype=np.float32)
        terminated = fields.terminated_of(view)
        truncated = fields.truncated_of(view)
        infos = [self._info(view, i) for i in range(self.num_envs)]
        for index, final in self.client.finals:
            rewards[index] = final[fields.reward]
            terminated[index] = bool(fields.terminated_of(final))
            truncated[index] = bool(fields.truncated_of(final))
            info = infos[index]
            info.update({name: final[name].item() for name in fields.info})
            info["terminal_observation"] = observation_of(final, fields.observations)
        dones = terminated | truncated
        for i in np.flatnonzero(dones):
            infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
        return self._observe(view), rewards, dones, infos

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.client.close()

    def action_masks(self) -> np.ndarray:
        """(N, act_n) bool: the legal actions of each env's current state."""
        return self._masks.copy()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        index = list(self._get_indices(indices))
        if attr_name in self._attrs:
            return [self._attrs[attr_name][i] for i in index]
        if attr_name == "action_masks":
            return [self._mask_getter(i) for i in index]
        if attr_name in ("render_mode", "spec"):
            return [None for _ in index]
        if attr_name in ("observation_space", "action_space"):
            return [getattr(self, attr_name) for _ in index]
        raise AttributeError(f"remote envs have no attribute {attr_name!r}")

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        values = self._attrs.setdefault(attr_name, [None] * self.num_envs)
        for i in self._get_indices(indices):
            values[i] = value

    def env_method(
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        return [
            method(*method_args, **method_kwargs) for method in self.get_attr(method_name, indices)
        ]

    def env_is_wrapped(
        self,
        wrapper_class: type[gymnasium.Wrapper[Any, Any, Any, Any]],
        indices: VecEnvIndices = None,
    ) -> list[bool]:
        return [False for _ in self._get_indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [None for _ in range(self.num_envs)]

    # -- internals -----------------------------------------------------------------------------

    def _truncate_failed(self, error: EnvError) -> VecEnvStepReturn:
        """``on_env_error="truncate"``: every env's current result, each env that raised ended
        as truncated with the error in its info (see the class docstring)."""
        failed = sorted({int(i) for i in _FAILED_ENV.findall(error.text)})
        if not failed or "could not be reset" in error.text:
            raise error  # no env named, or one left without a state: nothing to go on with
        log.error("remote env(s) %s raised; their episodes end as truncated: %s", failed, error)
        view, _ = self.client.observe()
        fields = self.fields
        n = self.num_envs
        rewards = np.array(view[fields.reward], dtype=np.float32).reshape(n)
        terminated = np.asarray(fields.terminated_of(view)).reshape(n)
        truncated = np.asarray(fields.truncated_of(view)).reshape(n)
        dones = terminated | truncated
        infos = [self._info(view, i) for i in range(n)]
        for ended in np.flatnonzero(dones).tolist():
            infos[ended]["TimeLimit.truncated"] = bool(truncated[ended] and not terminated[ended])
        observations = self._observe(view)
        for i in failed:
            rewards[i] = 0.0  # the failed step's reward is unknown
            dones[i] = True
            infos[i]["terminal_observation"] = (
                {name: value[i].copy() for name, value in observations.items()}
                if isinstance(observations, dict)
                else observations[i].copy()
            )
            infos[i]["TimeLimit.truncated"] = True
            infos[i]["env_error"] = error.text
        return observations, rewards, dones, infos

    def _mask_getter(self, index: int) -> Any:
        return lambda: self._masks[index].copy()

    def _observe(self, view: Any) -> VecEnvObs:
        if self.fields.mask is not None:
            mask = view[self.fields.mask].reshape(self.num_envs, -1)
            n = min(mask.shape[1], self._masks.shape[1])
            self._masks[:] = False
            self._masks[:, :n] = mask[:, :n]
        return observation_of(view, self.fields.observations, self.num_envs)

    def _info(self, view: Any, index: int) -> dict[str, Any]:
        return {
            name: np.asarray(view[name]).reshape(self.num_envs)[index].item()
            for name in self.fields.info
        }
