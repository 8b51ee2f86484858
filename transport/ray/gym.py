"""Gymnasium adapter over Ray-placed env servers: ``RayVectorEnv``.

``transport.gym.RemoteVectorEnv`` driving a ``ClusterClient`` instead of one connection, with the
``truncate`` lost-server policy: an env whose server is lost ends its episode as truncated
(``truncated=True``, reward 0, its last observation) and starts a new one at its next reset (the
next step with ``next_step`` auto-reset, the same step with ``same_step``, where
``infos["final_obs"]`` holds its last observation). Loss steps carry
``infos["transport_lost"]`` with its ``"_transport_lost"`` mask; the typed error itself is
``env.cluster.last_lost``.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from gymnasium.vector import AutoresetMode

from transport.errors import AdapterError
from transport.gym import (
    Bounds,
    RemoteVectorEnv,
    autoreset_mode_of,
)
from transport.ray.client import ClusterClient, LostEnvPolicy
from transport.ray.servers import DEFAULT_TIMEOUT, ServerSet

LOST_INFO = "transport_lost"
"""The info key that marks envs whose episode a lost server ended."""
TRUNCATING = LostEnvPolicy(on_step="truncate")


def adapter_policy(policy: LostEnvPolicy | None) -> LostEnvPolicy:
    """The adapters' policy: ``truncate`` (a training loop cannot catch a step's exception)."""
    if policy is None:
        return TRUNCATING
    if policy.on_step != "truncate":
        raise AdapterError("the adapters need LostEnvPolicy(on_step='truncate')")
    return policy


class RayVectorEnv(RemoteVectorEnv):
    """Every env of an ``EnvServers`` as one ``gymnasium.vector.VectorEnv`` (server auto-reset).

    Same behaviour as ``RemoteVectorEnv`` (``next_step`` by default, or ``same_step``), plus
    lost servers: see the module docstring.
    """

    def __init__(
        self,
        servers: ServerSet,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        observation_bounds: Bounds | None = None,
        policy: LostEnvPolicy | None = None,
    ) -> None:
        mode = autoreset_mode_of(autoreset_mode)
        if mode == AutoresetMode.DISABLED:
            raise AdapterError("RayVectorEnv needs server-side auto-reset: NEXT_STEP or SAME_STEP")
        wire = "next_step" if mode == AutoresetMode.NEXT_STEP else "same_step"
        self.cluster = ClusterClient(
            servers, autoreset=wire, timeout=timeout, policy=adapter_policy(policy)
        )
        # RemoteVectorEnv drives the cluster as its client (reset, step, finals, schema).
        super().__init__(
            autoreset_mode=mode,
            observation_bounds=observation_bounds,
            client=cast(Any, self.cluster),
        )

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        observations, rewards, terminated, truncated, infos = super().step(actions)
        restored = self.cluster.restored
        if restored.any() and self.autoreset_mode == AutoresetMode.NEXT_STEP:
            rewards[restored] = 0.0  # the reset step of an episode ended by a loss
            terminated[restored] = False
            truncated[restored] = False
        lost = self.cluster.truncated_by_loss
        if lost.any():
            rewards[lost] = 0.0
            terminated[lost] = False
            truncated[lost] = True
            infos[LOST_INFO] = lost.copy()
            infos["_" + LOST_INFO] = lost.copy()
        return observations, rewards, terminated, truncated, infos
