"""A real MuJoCo env (Hopper: Box observation, Box actions) over the Ray scale-out (issue 23
item 2): ``transport.ray.launch(gym_factory(...), schema=gym_schema(...))`` on 2 servers of 2
envs, driven by ``vector_env()`` in both server auto-reset modes, equals gymnasium's
``SyncVectorEnv`` of 4 envs on the same seeds step by step (env i of the cluster: seed + i).

One test (a Ray start is slow); the other real-env paths are in tests/test_real_envs.py. Skipped,
with the reason, only where Ray or MuJoCo cannot be imported, or Ray cannot start here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("ray", reason="Ray is not installed (pip install 'transport[ray]')")
pytest.importorskip("mujoco", reason="MuJoCo is not installed (pip install 'transport[gym]')")

from transport.ray.testing import use_loopback

use_loopback()  # before anything below talks to Ray

from transport.gym_serve import gym_factory, gym_schema  # noqa: E402
from transport.ray import launch  # noqa: E402

from .ray_util import cluster_or_skip  # noqa: E402
from .test_real_envs import (  # noqa: E402
    HOPPER_KWARGS,
    compare_lockstep,
    hopper,
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    yield from cluster_or_skip(nodes=1, num_cpus=2)


def test_hopper_over_ray_equals_sync_vector_env(cluster: Any) -> None:
    with launch(
        gym_factory("Hopper-v5", HOPPER_KWARGS),
        schema=gym_schema("Hopper-v5", HOPPER_KWARGS),
        num_servers=2,
        num_envs=2,
        num_cpus=0.25,
        ready_timeout=120,
    ) as servers:
        for mode in ("next_step", "same_step"):
            envs = servers.vector_env(autoreset_mode=mode, timeout=60)
            try:
                assert envs.num_envs == 4
                compare_lockstep(envs, hopper, mode, steps=50)
            finally:
                envs.close()
