"""``RemoteAECEnv.observe(agent)`` before that agent's first turn: zeros in the observation
space's shape and dtype (it was the flat ``(obs_n,)``, outside a multi-dim space), for PettingZoo
board games served by ``transport.pettingzoo.aec_server``; every observation the adapter builds
(``observe``, ``last``, ``RemoteAECTables``) has the space's shape."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from gymnasium import spaces
from pettingzoo.classic import connect_four_v3, go_v5, tictactoe_v3

from transport.pettingzoo import RemoteAECEnv, RemoteAECTables, aec_schema, aec_server

from .servers import unique_url

GAMES: dict[str, Callable[[], Any]] = {
    "tictactoe": tictactoe_v3.env,  # int8 (3, 3, 2)
    "connect_four": connect_four_v3.env,  # int8 (6, 7, 2)
    "go": functools.partial(go_v5.env, board_size=5, komi=0.5),  # bool (5, 5, 17)
}


@pytest.mark.parametrize("game", list(GAMES))
def test_observe_before_an_agents_first_turn_is_zeros_of_its_space(game: str) -> None:
    make = GAMES[game]
    local = make()
    local.reset(seed=0)
    with aec_server(make, unique_url("unix"), name=game).start() as server:
        env = RemoteAECEnv(server.bound_url, schema=aec_schema(make), timeout=60)
        try:
            env.reset(seed=0)
            waiting = env.possible_agents[1]  # the first agent acts first: the second waits
            assert env.agent_selection != waiting
            space = env.observation_space(waiting)
            assert isinstance(space, spaces.Dict)
            box = space["observation"]
            seen = env.observe(waiting)
            assert (
                seen["observation"].shape
                == box.shape
                == local.observation_space(waiting)["observation"].shape
            )
            assert seen["observation"].dtype == box.dtype
            assert not seen["observation"].any() and not seen["action_mask"].any()
            assert space.contains(seen), (seen["observation"].shape, box)
            seen["observation"][...] = 1  # a copy: the next observe is zeros again
            assert not env.observe(waiting)["observation"].any()
            # the agent that acts and, after its move, the one that waited: the same shape
            observation, *_ = env.last()
            assert space.contains(observation)
            env.step(int(np.flatnonzero(observation["action_mask"])[0]))
            assert env.agent_selection == waiting
            assert space.contains(env.observe(waiting))
        finally:
            env.close()
            local.close()


def test_tables_observations_have_the_spaces_shape() -> None:
    make = GAMES["tictactoe"]
    with aec_server(make, unique_url("unix"), num_envs=2, name="tictactoe").start() as server:
        with RemoteAECTables(server.bound_url, schema=aec_schema(make), timeout=60) as tables:
            step = tables.reset(seed=0)
            shape = tables.observation_space.shape
            assert shape is not None and step.observation.shape == (2, *shape)
            assert all(tables.observation_space.contains(row) for row in step.observation)
