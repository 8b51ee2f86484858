"""Contract checks for the episode collector (issue 14 item 2): over every backend, server
language and schema, ``transport.EpisodeCollector`` fills padded batches of complete contract-env
episodes, and the same seed gives the same bytes. Registered with ``_check`` like the checks of
``transport.testing.checks``."""

from __future__ import annotations

import numpy as np

from transport.collector import EpisodeBatch, EpisodeCollector
from transport.testing.checks import CheckContext, _check, wire_actions
from transport.testing.contract_env import TRUNCATE_AT

BATCH = 4
MAX_LEN = 8


def observation_fields(batch: EpisodeBatch) -> list[np.ndarray]:
    """Every observation field's ``[B, K, ...]`` array (one field, or a dict of several)."""
    obs = batch.observations
    return list(obs.values()) if isinstance(obs, dict) else [obs]


def _collect(ctx: CheckContext, seed: int) -> list[EpisodeBatch]:
    def first_action(obs: object, env_ids: np.ndarray) -> np.ndarray:
        """Action 0 for every env (always legal in the contract env), in the action's shape."""
        return np.asarray(wire_actions(ctx.schema, [0] * len(env_ids)))

    server = ctx.server(num_envs=2)
    with (
        ctx.connect(server, autoreset="next_step") as client,
        EpisodeCollector(client, first_action, MAX_LEN, BATCH, seed=seed) as collector,
    ):
        return [collector.request_episodes(timeout=30) for _ in range(2)]


@_check(per_schema=True)
def check_episode_collector(ctx: CheckContext) -> None:
    """The episode collector returns padded batches of complete episodes (contract-env lengths
    2..TRUNCATE_AT, the end flag on each last step only), the same bytes for the same seed."""
    first = _collect(ctx, 31)
    again = _collect(ctx, 31)
    for batch in first:
        lengths = batch.lengths.tolist()
        assert all(2 <= n <= TRUNCATE_AT for n in lengths), f"episode lengths {lengths}"
        assert batch.rewards.shape == (BATCH, max(lengths))
        ends = batch.terminated | batch.truncated
        for row, n in enumerate(lengths):
            assert ends[row].nonzero()[0].tolist() == [n - 1], f"episode {row}: ends {ends[row]}"
            assert not any(obs[row, n:].any() for obs in observation_fields(batch)), (
                f"episode {row}: padding not zero"
            )
    assert [b.job_ids.tolist() for b in first] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [b.tobytes() for b in first] == [b.tobytes() for b in again], "same seed, other bytes"
