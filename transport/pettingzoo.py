"""PettingZoo adapter: ``RemoteAECEnv``, a turn-based multi-agent server as an AEC env.

Install with ``pip install transport[pettingzoo]``. The server serves one env (a table) per
connection on a schema whose result struct names the seat that acts next in an enum field
(``agent``: the mahjong_env schema's ``AgentStep``, seed 003). Agents are the enum's value names
in lower case (``player_0`` .. ``player_3``). Observations are dicts ``{"observation": array,
"action_mask": int8 array}`` (PettingZoo's classic-env convention), copies; the observation has
the schema's observation field's shape and dtype (float32 ``(290,)`` for mahjong, int8
``(3, 3, 2)`` for a served tic-tac-toe), as its space says.

Rewards (the contract a turn-based server follows, see transport/envs/mahjong.py):

- a result's ``reward`` belongs to the seat named in ``agent``;
- the game is zero-sum at the end: on a terminal result (``terminated`` or ``truncated``) the
  named seat gets ``reward`` and every other seat ``-reward / (n - 1)``; then every agent is
  terminated (or truncated) and is stepped with ``None`` once, as PettingZoo requires.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv

from transport.api import Server, connect
from transport.client import DEFAULT_TIMEOUT, Client
from transport.codec import Schema
from transport.envs.in_place import RecordPlan
from transport.errors import AdapterError
from transport.gym import (
    SERVE_HINT,
    Bounds,
    ResultFields,
    check_render_mode,
    frame_of,
    observation_bounds_of,
    observe_infos,
    resolve_url,
    step_explained,
)
from transport.runtime.env import Spaces
from transport.spaces import observation_space_of
from transport.step_view import StepView


def _default_schema() -> Schema:
    from transport.generated import mahjong_env

    return mahjong_env.SCHEMA


class RemoteAECEnv(AECEnv[str, dict[str, np.ndarray], int | None]):
    """A remote turn-based game as a PettingZoo ``AECEnv``.

    ``schema`` defaults to mahjong_env; ``agent_field`` names the result field (an enum) that
    says which seat acts next. ``observe(agent)`` returns the last observation that agent was
    shown (before its first turn: zeros of the observation space's shape and dtype, and an
    all-zero action mask).
    """

    metadata: dict[str, Any] = {
        "render_modes": ["rgb_array"],
        "name": "transport_remote_aec_v0",
        "is_parallelizable": False,
    }

    def __init__(
        self,
        url: str | None = None,
        *,
        schema: Schema | str | Path | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        agent_field: str = "agent",
        observation_bounds: Bounds | None = None,
        render_mode: str | None = None,
    ) -> None:
        super().__init__()
        check_render_mode(render_mode)  # before connecting
        codecs = _default_schema() if schema is None else schema
        self.client = connect(resolve_url(url), codecs, timeout=timeout)
        try:
            if self.client.num_envs != 1:
                raise AdapterError(
                    f"{self.client.url} serves {self.client.num_envs} envs per connection and "
                    "RemoteAECEnv plays one table: play them all with RemoteAECTables (one "
                    "request steps every table), or serve one env per connection ("
                    + SERVE_HINT.format(n=1)
                    + ")"
                )
            self.fields = ResultFields(self.client)
            if self.fields.mask is None:
                raise AdapterError("RemoteAECEnv needs a result field with role action_mask")
            result = self.client.schema.ir.structs[
                self.client.schema.ir.messages["STEP_RESP"].body or ""
            ]
            field = next((f for f in result.fields if f.name == agent_field), None)
            enum = self.client.schema.ir.enums.get(field.elem) if field is not None else None
            if field is None or enum is None:
                raise AdapterError(
                    f"the result struct {result.name} needs an enum field {agent_field!r} "
                    "naming the agent that acts next"
                )
            space = self.client.spaces()
            bounds = observation_bounds_of(self.client, observation_bounds)
        except BaseException:
            self.client.close()
            raise
        self.agent_field = agent_field
        by_value = sorted(enum.values.items(), key=lambda item: item[1])
        self._names = {value: name.lower() for name, value in by_value}
        self.possible_agents = [name.lower() for name, _ in by_value]
        self.agents = self.possible_agents[:]
        self.render_mode = check_render_mode(render_mode)
        obs_space = spaces.Dict(
            {
                "observation": observation_space_of(self.client.schema, bounds),
                "action_mask": spaces.Box(0, 1, (space.act_n,), dtype=np.int8),
            }
        )
        self.observation_spaces = {agent: obs_space for agent in self.possible_agents}
        self.action_spaces = {agent: spaces.Discrete(space.act_n) for agent in self.possible_agents}
        self._act_n = space.act_n
        # the observation field's own shape and dtype, as each result shows it (not obs_n flat)
        self._obs_zeros = np.array(
            np.zeros((), dtype=self.client.schema[result.name].dtype)[self.fields.observation]
        )
        self._observations: dict[str, dict[str, np.ndarray]] = {}
        self.rewards = {agent: 0.0 for agent in self.agents}
        self._cumulative_rewards = {agent: 0.0 for agent in self.agents}
        self.terminations = {agent: False for agent in self.agents}
        self.truncations = {agent: False for agent in self.agents}
        self.infos: dict[str, dict[str, Any]] = {agent: {} for agent in self.agents}
        self.agent_selection = self.possible_agents[0]

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return self.action_spaces[agent]

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        observation = self._observations.get(agent)
        if observation is None:
            observation = {
                "observation": self._obs_zeros,  # copied below
                "action_mask": np.zeros(self._act_n, dtype=np.int8),
            }
        return {key: value.copy() for key, value in observation.items()}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        view = self.client.reset(seed)
        self.agents = self.possible_agents[:]
        self.rewards = {agent: 0.0 for agent in self.agents}
        self._cumulative_rewards = {agent: 0.0 for agent in self.agents}
        self.terminations = {agent: False for agent in self.agents}
        self.truncations = {agent: False for agent in self.agents}
        self.infos = {agent: {} for agent in self.agents}
        self._observations = {}
        self._absorb(view)

    def step(self, action: int | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        if action is None:
            raise ValueError(f"{agent} is alive: step it with an action, not None")
        self._cumulative_rewards[agent] = 0.0
        view = step_explained(self.client, int(action))
        self._absorb(view)

    def action_mask(self, agent: str) -> np.ndarray:
        """The legal actions of ``agent`` (int8; all zeros when it is not its turn)."""
        if agent != self.agent_selection:
            return np.zeros(self._act_n, dtype=np.int8)
        return self.observe(agent)["action_mask"]

    def render(self) -> np.ndarray | None:
        """The table's rgb_array frame (``render_mode="rgb_array"``, see transport.gym's
        ``FRAME_HELP``), else None."""
        if self.render_mode is None:
            return None
        return frame_of(observe_infos(self.client)[0], self.client.url)

    def state(self) -> np.ndarray:
        """The game's global state (float32), as the env serves it: the ``'state'`` entry of
        its ``info()`` map, a sequence of numbers (asked with OBSERVE: no step)."""
        state = observe_infos(self.client)[0].get("state")
        if state is None:
            raise AdapterError(
                f"{self.client.url}: the env serves no global state: an env that has one "
                "returns it from info() as {'state': [numbers]}"
            )
        try:
            return np.asarray(state, dtype=np.float32).reshape(-1)
        except (TypeError, ValueError) as exc:
            raise AdapterError(
                f"{self.client.url}: the env's 'state' is not a sequence of numbers: {exc}"
            ) from None

    def close(self) -> None:
        self.client.close()

    # -- internals -----------------------------------------------------------------------------

    def _absorb(self, view: StepView) -> None:
        """Take a result: who acts next, what it sees, rewards, and the end of the game."""
        fields = self.fields
        value = int(view[self.agent_field])
        agent = self._names.get(value)
        if agent is None:
            raise AdapterError(f"the server named agent {value}, not one of {self._names}")
        mask = view[fields.mask or ""][: self._act_n].astype(np.int8)
        self._observations[agent] = {
            "observation": np.array(view[fields.observation], copy=True),
            "action_mask": mask,
        }
        reward = float(view[fields.reward])
        terminated = bool(fields.terminated_of(view))
        truncated = bool(fields.truncated_of(view))
        info = {name: view[name].item() for name in fields.info}
        self.rewards = {a: 0.0 for a in self.agents}
        self.rewards[agent] = reward
        if terminated or truncated:
            share = -reward / (len(self.agents) - 1) if len(self.agents) > 1 else 0.0
            for other in self.agents:
                if other != agent:
                    self.rewards[other] = share
                self.terminations[other] = terminated
                self.truncations[other] = truncated and not terminated
        self.infos[agent] = info
        self._accumulate_rewards()
        self.agent_selection = agent
        if terminated or truncated:
            self._deads_step_first()


# -- many tables per connection ----------------------------------------------------------------


def _agent_names(client: Client, agent_field: str) -> list[str]:
    """The seats of a turn-based schema: the value names (lower case, by value) of the enum
    field ``agent_field`` of its result struct; a clear error when there is none."""
    result = client.schema.ir.structs[client.schema.ir.messages["STEP_RESP"].body or ""]
    field = next((f for f in result.fields if f.name == agent_field), None)
    enum = client.schema.ir.enums.get(field.elem) if field is not None else None
    if field is None or enum is None:
        raise AdapterError(
            f"the result struct {result.name} needs an enum field {agent_field!r} "
            "naming the agent that acts next"
        )
    if sorted(enum.values.values()) != list(range(len(enum.values))):
        raise AdapterError(f"the enum {enum.name} of {agent_field!r} must number its seats 0..n-1")
    return [name.lower() for name, _ in sorted(enum.values.items(), key=lambda item: item[1])]


@dataclass
class TablesStep:
    """What every table shows after a reset or a step: row ``i`` is table ``i``.

    ``observation`` and ``action_mask`` are those of the seat that acts next (``agent``); after a
    game ended (``terminated | truncated``) they belong to the table's next game, already dealt,
    and ``rewards`` holds what each seat scored in the game that ended (``final_agent`` names the
    seat its final result named: the winner, or on a draw the seat that would have drawn)."""

    agent: np.ndarray
    """int64 [N]: the seat (index into ``possible_agents``) that acts next at each table."""
    observation: np.ndarray
    """[N, *observation shape] (the schema's observation field): what that seat sees."""
    action_mask: np.ndarray
    """int8 [N, act_n]: its legal actions."""
    rewards: np.ndarray
    """float32 [N, seats]: each seat's reward from this step (non-zero when a game ended)."""
    terminated: np.ndarray
    """bool [N]: the table's game ended with this step (and restarted)."""
    truncated: np.ndarray
    """bool [N]: the table's game was cut short with this step (and restarted)."""
    final_agent: np.ndarray
    """int64 [N]: the seat named by the ended game's final result, -1 where no game ended."""
    infos: list[dict[str, Any]]
    """One dict per table: the scalar info fields of its current result; where a game ended,
    ``"final_info"`` holds those of the ended game's final result (gymnasium's name)."""


class RemoteAECTables:
    """N tables of a remote turn-based game on one connection, stepped in one request.

    A vectorised AEC env for multi-agent training (seed 003: 8 parallel tables): the server is a
    multi-env server of a turn-based schema (``transport-serve URL --env mahjong --num-envs 8``),
    one env per table. Every table always awaits one action (from the seat in ``agent``), so
    ``step(actions)`` takes one action per table and steps them all in one request. A finished
    table restarts at once (the server's same-step auto-reset) while the others go on; its
    final per-seat rewards are in that step's ``rewards``: the seat named in the final result
    gets its ``reward``, every other seat ``-reward / (seats - 1)`` (zero-sum, as
    ``RemoteAECEnv`` pays). Arrays are copies unless ``copy=False`` (views valid until the next
    call: no copy of the observations).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        schema: Schema | str | Path | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        agent_field: str = "agent",
        num_tables: int | None = None,
        observation_bounds: Bounds | None = None,
        copy: bool = True,
    ) -> None:
        codecs = _default_schema() if schema is None else schema
        self.client = connect(resolve_url(url), codecs, timeout=timeout, autoreset="same_step")
        try:
            if num_tables is not None and num_tables != self.client.num_envs:
                raise AdapterError(
                    f"{self.client.url} serves {self.client.num_envs} env(s) (tables) per "
                    f"connection, RemoteAECTables was asked for {num_tables}: pass "
                    f"num_tables={self.client.num_envs} (or None: the server's count), or "
                    + SERVE_HINT.format(n=num_tables)
                )
            self.num_tables = self.client.num_envs
            self.fields = ResultFields(self.client)
            if self.fields.mask is None:
                raise AdapterError("RemoteAECTables needs a result field with role action_mask")
            self.possible_agents = _agent_names(self.client, agent_field)
            space = self.client.spaces()
            bounds = observation_bounds_of(self.client, observation_bounds)
        except BaseException:
            self.client.close()
            raise
        self.agent_field = agent_field
        self.copy = copy
        self.num_seats = len(self.possible_agents)
        self.observation_space = observation_space_of(self.client.schema, bounds)
        self.action_space = spaces.Discrete(space.act_n)
        self._act_n = space.act_n
        self._actions = np.zeros(self.num_tables, dtype=np.int64)
        self.last: TablesStep | None = None

    def reset(self, seed: int | None = None) -> TablesStep:
        """Deal a new game at every table (table ``i`` gets ``seed + i``)."""
        view = self.client.reset(seed)
        self.last = self._tables(view, [])
        return self.last

    def step(self, actions: Sequence[int] | np.ndarray) -> TablesStep:
        """One action per table, for the seat that acts there (``last.agent``)."""
        if len(actions) != self.num_tables:
            raise ValueError(
                f"expected {self.num_tables} actions (one per table), got {len(actions)}"
            )
        self._actions[:] = actions
        view = step_explained(self.client, self._actions)
        self.last = self._tables(view, self.client.finals)
        return self.last

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RemoteAECTables:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------------

    def _rows(self, view: StepView, name: str) -> np.ndarray:
        """Field ``name`` with one leading table axis (a 1-env server's reset result has none,
        its batched step result one: both become ``[1, ...]``)."""
        shape = view.record.dtype[name].shape
        return np.asarray(view[name]).reshape((self.num_tables, *shape))

    def _seats(self, values: np.ndarray) -> np.ndarray:
        seats = values.astype(np.int64)
        bad = (seats < 0) | (seats >= self.num_seats)
        if bad.any():
            raise AdapterError(
                f"the server named seat {int(seats[bad][0])}, not one of 0..{self.num_seats - 1}"
            )
        return seats

    def _tables(self, view: StepView, finals: list[tuple[int, StepView]]) -> TablesStep:
        fields = self.fields
        n = self.num_tables
        observation = self._rows(view, fields.observation)
        agent = self._seats(self._rows(view, self.agent_field))
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        rewards = np.zeros((n, self.num_seats), dtype=np.float32)
        final_agent = np.full(n, -1, dtype=np.int64)
        infos: list[dict[str, Any]] = []
        for i in range(n):
            infos.append({name: self._rows(view, name)[i].item() for name in fields.info})
        for index, final in finals:
            seat = int(self._seats(np.asarray([final[self.agent_field]]))[0])
            reward = float(final[fields.reward])
            if reward and self.num_seats > 1:  # a draw pays 0, not -0.0
                rewards[index] = -reward / (self.num_seats - 1)
            rewards[index, seat] = reward
            final_agent[index] = seat
            terminated[index] = bool(fields.terminated_of(final))
            truncated[index] = bool(fields.truncated_of(final)) and not terminated[index]
            infos[index]["final_info"] = {name: final[name].item() for name in fields.info}
        if self.copy:
            observation = observation.copy()
        return TablesStep(
            agent=agent,
            observation=observation,
            action_mask=self._rows(view, fields.mask or "")[:, : self._act_n].astype(np.int8),
            rewards=rewards,
            terminated=terminated,
            truncated=truncated,
            final_agent=final_agent,
            infos=infos,
        )


# -- serving a PettingZoo AEC env ---------------------------------------------------------------


def _aec_parts(env: Any) -> tuple[Any, Any, bool, int, list[str]]:
    """(observation Box, action Discrete, whether observations carry an action mask, act_n,
    agents) of a PettingZoo AEC env that ``AECServerEnv`` can serve; a SchemaError saying why
    not."""
    from transport.errors import SchemaError

    agents = [str(a) for a in env.possible_agents]
    if not agents or any(not a.isidentifier() or a != a.lower() for a in agents):
        raise SchemaError(f"agents {agents}: each must be a lower-case identifier (an enum value)")
    first = env.observation_space(agents[0])
    action = env.action_space(agents[0])
    for agent in agents[1:]:
        if env.observation_space(agent) != first or env.action_space(agent) != action:
            raise SchemaError(f"agent {agent!r} has other spaces than {agents[0]!r}: one layout")
    masked = isinstance(first, spaces.Dict) and set(first.spaces) == {"observation", "action_mask"}
    observation = first["observation"] if masked else first
    if not isinstance(observation, spaces.Box) or not isinstance(action, spaces.Discrete):
        raise SchemaError(
            f"observation {first!r}, action {action!r}: a served AEC env has a Box observation "
            "(or PettingZoo's classic {'observation': Box, 'action_mask': Box}) and a Discrete "
            "action"
        )
    if int(action.start) != 0:
        raise SchemaError(f"action {action!r}: a Discrete action starting at 0")
    return observation, action, masked, int(action.n), agents


def aec_schema_toml(env: Any, name: str = "aec_env") -> str:
    """The TOML of the turn-based schema of a PettingZoo AEC env: the observation of the agent
    that acts next, its action mask, reward, terminated, truncated and ``agent`` (an enum of
    ``possible_agents``), the schema ``RemoteAECEnv`` plays."""
    from transport.gym_schema import _DTYPES, _finite, _toml

    observation, _, _, act_n, agents = _aec_parts(env)
    elem = _DTYPES.get(np.dtype(observation.dtype).name)
    if elem is None:
        from transport.errors import SchemaError

        raise SchemaError(f"observation dtype {observation.dtype} has no schema type")
    dims = ",".join(str(int(n)) for n in observation.shape) or "1"
    low, high = _finite(observation.low), _finite(observation.high)
    bounds = (
        f", low = {_toml(low)}, high = {_toml(high)}"
        if low is not None and high is not None and elem != "bool"  # (Go: bool planes)
        else ""
    )
    agent_type = "u8" if len(agents) <= 256 else "u16"
    action_type = "u8" if act_n <= 256 else "u16" if act_n <= 65536 else "u32"
    values = "\n".join(f"{agent} = {k}" for k, agent in enumerate(agents))
    return (
        "# A PettingZoo AEC env served by transport.pettingzoo.serve_aec.\n"
        f'[schema]\nname = "{name}"\nversion = 1\n\n'
        f'[enums.Agent]\ntype = "{agent_type}"\n\n[enums.Agent.values]\n{values}\n\n'
        "[structs.StepResult]\nfields = [\n"
        f'  {{ name = "observation", type = "{elem}[{dims}]", role = "observation"{bounds} }},\n'
        f'  {{ name = "action_mask", type = "u8[{act_n}]", role = "action_mask" }},\n'
        '  { name = "reward", type = "f64", role = "reward" },\n'
        '  { name = "terminated", type = "bool", role = "terminated" },\n'
        '  { name = "truncated", type = "bool", role = "truncated" },\n'
        '  { name = "agent", type = "Agent" },\n]\n\n'
        f'[structs.StepRequest]\nfields = [\n  {{ name = "action", type = "{action_type}", '
        'role = "action" },\n]\n\n[env]\n'
    )


class AECServerEnv:
    """One PettingZoo AEC env (a table) behind the server's Env interface, for ``RemoteAECEnv``.

    Each result names the agent that acts next in ``agent``, with what it observes, its action
    mask and its reward. The step that ends the game names the agent that made it, with its
    reward: RemoteAECEnv pays every other agent ``-reward / (n - 1)``, so a game whose final
    rewards are not so (not zero-sum) is an env error saying so, never a silent other payout.
    Rewards of agents other than the next one before the end are not carried, and every agent
    ends with the game (an agent that ends before is an env error): the classic board games.
    """

    _out: Any = None  # the record ``_plan`` stores into (kept: its id cannot be reused)
    _plan: tuple[RecordPlan, np.ndarray, np.ndarray] | None = None  # + mask and agent views

    def __init__(self, make: Callable[[], Any]) -> None:
        self.env = make()
        observation, _, self._masked, self._act_n, self._agents = _aec_parts(self.env)
        self._index = {agent: k for k, agent in enumerate(self._agents)}
        self._obs_n = int(np.prod(observation.shape or (1,)))
        self._observation = {
            "type": "box",
            "shape": list(observation.shape),
            "field": "observation",
        }

    def spaces(self) -> Spaces:
        return Spaces(self._obs_n, self._act_n)

    def _result(
        self, agent: str, reward: float, terminated: bool, truncated: bool
    ) -> dict[str, Any]:
        seen = self.env.observe(agent)
        mask = seen["action_mask"] if self._masked else np.ones(self._act_n, dtype=np.uint8)
        return {
            "observation": np.asarray(seen["observation"] if self._masked else seen),
            "action_mask": np.asarray(mask, dtype=np.uint8),
            "reward": float(reward),
            "terminated": terminated,
            "truncated": truncated,
            "agent": self._index[agent],
        }

    def _write(
        self, out: np.ndarray, agent: str, reward: float, terminated: bool, truncated: bool
    ) -> dict[str, Any] | None:
        """The result stored in ``out`` (``transport.envs.in_place``); the mapping instead
        where the observation is not an array of the field's dtype and shape."""
        if out is not self._out:
            plan = RecordPlan.of(out, self._observation)
            self._out = out
            self._plan = None if plan is None else (plan, out["action_mask"], out["agent"])
        if self._plan is None:
            return self._result(agent, reward, terminated, truncated)
        plan, mask_view, agent_view = self._plan
        seen = self.env.observe(agent)
        if not plan.store_result(
            seen["observation"] if self._masked else seen, reward, terminated, truncated
        ):
            return self._result(agent, reward, terminated, truncated)
        mask = seen["action_mask"] if self._masked else 1
        if self._masked and (type(mask) is not np.ndarray or mask.shape != mask_view.shape):
            return self._result(agent, reward, terminated, truncated)  # the codec checks it
        mask_view[...] = mask  # cast to u8 as np.asarray(mask, dtype=np.uint8) casts
        agent_view[...] = self._index[agent]
        return None

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        self.env.reset(seed=seed)
        return self._result(self.env.agent_selection, 0.0, False, False)

    def reset_into(self, seed: int | None, out: np.ndarray) -> dict[str, Any] | None:
        self.env.reset(seed=seed)
        return self._write(out, self.env.agent_selection, 0.0, False, False)

    def step(self, action: int) -> dict[str, Any]:
        return self._result(*self._advance(action))

    def step_into(self, action: int, out: np.ndarray) -> dict[str, Any] | None:
        return self._write(out, *self._advance(action))

    def _advance(self, action: int) -> tuple[str, float, bool, bool]:
        """Play ``action``: (the agent the result is for, its reward, terminated, truncated)."""
        env = self.env
        actor = env.agent_selection
        env.step(int(action))
        live = [a for a in env.agents if not (env.terminations[a] or env.truncations[a])]
        if live and env.agents:
            following = env.agent_selection
            if following not in live:
                raise ValueError(
                    f"agent {following!r} ended while {live} play on: a served AEC env's agents "
                    "end together (RemoteAECEnv ends every agent with the game)"
                )
            return following, float(env.rewards.get(following, 0.0)), False, False
        rewards = {a: float(env.rewards.get(a, 0.0)) for a in self._agents}
        reward = rewards[actor]
        share = -reward / (len(self._agents) - 1) if len(self._agents) > 1 else 0.0
        others = {a: r for a, r in rewards.items() if a != actor}
        if any(abs(r - share) > 1e-9 * max(1.0, abs(share)) for r in others.values()):
            raise ValueError(
                f"the game's final rewards {rewards} are not zero-sum as RemoteAECEnv pays them "
                f"({actor!r}: {reward}, every other agent {share})"
            )
        terminated = any(bool(env.terminations.get(a, False)) for a in self._agents)
        return actor, reward, terminated, not terminated

    def close(self) -> None:
        self.env.close()


def aec_schema(make: Callable[[], Any], name: str = "aec_env") -> Schema:
    """The compiled schema of ``aec_schema_toml`` of the env ``make()`` returns."""
    from transport.schema import compile_schema

    env = make()
    try:
        text = aec_schema_toml(env, name)
    finally:
        env.close()
    return Schema(compile_schema(text, f"<{name}>"))


def aec_server(
    make: Callable[[], Any], url: str, *, num_envs: int = 1, name: str = "aec_env", **kwargs: Any
) -> Server:
    """A ``Server`` (not started) of a PettingZoo AEC env: one table per env, each made by
    ``make`` (a picklable zero-argument factory for worker processes); ``kwargs`` are
    ``transport.Server``'s. Play it with ``RemoteAECEnv(url, schema=aec_schema(make))``."""
    return Server(
        functools.partial(AECServerEnv, make),
        url,
        schema=aec_schema(make, name),
        num_envs=num_envs,
        env_name=name,
        **kwargs,
    )
