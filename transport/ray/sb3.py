"""Stable-Baselines3 adapter over Ray-placed env servers: ``RayVecEnv``.

``transport.sb3.RemoteVecEnv`` (same-step auto-reset) driving a ``ClusterClient`` with the
``truncate`` lost-server policy: an env whose server is lost ends its episode in that step with
``done=True``, reward 0, ``infos[i]["TimeLimit.truncated"] = True``, its last observation as
``infos[i]["terminal_observation"]`` and ``infos[i]["transport_lost"] = True``; the observation
returned for it is the first of a new episode on the restarted server. The typed error itself is
``env.cluster.last_lost``.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnvStepReturn

from transport.gym import Bounds
from transport.ray.client import ClusterClient, LostEnvPolicy
from transport.ray.gym import LOST_INFO, adapter_policy
from transport.ray.servers import DEFAULT_TIMEOUT, ServerSet
from transport.sb3 import RemoteVecEnv


class RayVecEnv(RemoteVecEnv):
    """Every env of an ``EnvServers`` as one SB3 ``VecEnv`` (same-step auto-reset).

    Same behaviour as ``transport.sb3.RemoteVecEnv``, plus lost servers: see the module
    docstring.
    """

    def __init__(
        self,
        servers: ServerSet,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        observation_bounds: Bounds | None = None,
        policy: LostEnvPolicy | None = None,
    ) -> None:
        self.cluster = ClusterClient(
            servers, autoreset="same_step", timeout=timeout, policy=adapter_policy(policy)
        )
        # RemoteVecEnv drives the cluster as its client (reset, step, finals, schema).
        super().__init__(observation_bounds=observation_bounds, client=cast(Any, self.cluster))

    def step_wait(self) -> VecEnvStepReturn:
        observations, rewards, dones, infos = super().step_wait()
        lost = self.cluster.truncated_by_loss
        for i in np.flatnonzero(lost):
            rewards[i] = 0.0
            dones[i] = True
            infos[i]["TimeLimit.truncated"] = True
            infos[i][LOST_INFO] = True
        return observations, rewards, dones, infos
