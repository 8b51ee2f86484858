"""The env runtime's two ways of checking a batch's actions agree (pure logic, no process).

``EnvRuntime.check_actions`` checks up to ``EACH_CHECK_MAX`` Discrete actions env by env with
the one-env rule and more with NumPy's vectorised checks (the faster way at each size). Over
random states (envs never reset or lost, episodes ended, masks, actions out of range, a mask
narrower than the action space) under every masked-action policy, with and without NEXT_STEP's
skip of ended envs, both ways refuse the same env with the same error or return the same noop
envs.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import transport.runtime.core as core
from transport.envs.echo import EchoEnv
from transport.generated import pac_env
from transport.protocol import RequestError
from transport.runtime.core import MASKED_ACTION_POLICIES
from transport.runtime.env import Spaces
from transport.runtime.host import EnvHost

MASK_WIDTH = 92  # pac_env's action_mask


class WideEchoEnv(EchoEnv):
    """Echo with 100 actions: the last 8 lie past pac_env's 92-wide mask (never masked)."""

    def spaces(self) -> Spaces:
        return Spaces(612, 100)


def _outcome(runtime: core.EnvRuntime, actions: np.ndarray, skip_done: bool) -> tuple[object, ...]:
    try:
        noop = runtime.check_actions(actions, skip_done=skip_done)
    except RequestError as exc:
        return ("refused", int(exc.code), exc.text)
    return ("ok", None if noop is None else noop.tolist())


@pytest.mark.parametrize("policy", MASKED_ACTION_POLICIES)
@pytest.mark.parametrize("env", [EchoEnv, WideEchoEnv])
@pytest.mark.parametrize("num_envs", [1, 3, 8])
def test_each_and_vectorised_checks_agree(
    policy: str, env: type[EchoEnv], num_envs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(f"{policy}-{env.__name__}-{num_envs}")
    host = EnvHost(pac_env.SCHEMA, env, num_envs=num_envs, masked_actions=policy)
    results = np.zeros(num_envs, dtype=host.result.dtype)
    runtime = host.runtime(host.create_envs(), results, None)
    assert runtime.masks is not None and runtime.masks.shape[1] == MASK_WIDTH
    act_n = runtime.spaces.act_n
    refused = noops = 0
    for _ in range(300):
        runtime.was_reset[:] = [rng.random() < 0.9 for _ in range(num_envs)]
        runtime.all_reset = bool(runtime.was_reset.all())
        for end in runtime.ends:
            end[:] = [rng.random() < 0.2 for _ in range(num_envs)]
        runtime.masks[:] = np.array(
            [[rng.random() < 0.8 for _ in range(MASK_WIDTH)] for _ in range(num_envs)]
        )
        count = num_envs + rng.randrange(2)  # a longer actions array is cut to num_envs
        actions = np.array(
            [
                rng.choice([rng.randrange(-3, act_n + 5), rng.randrange(act_n)])
                for _ in range(count)
            ],
            dtype=np.int32,
        )
        skip_done = rng.random() < 0.5
        outcomes = []
        for limit in (0, num_envs):  # vectorised, then env by env
            monkeypatch.setattr(core, "EACH_CHECK_MAX", limit)
            outcomes.append(_outcome(runtime, actions, skip_done))
        assert outcomes[0] == outcomes[1], (actions.tolist(), skip_done, runtime.was_reset)
        refused += outcomes[0][0] == "refused"
        noops += outcomes[0][0] == "ok" and outcomes[0][1] is not None
    assert refused > 0  # the random states reach the refusals
    assert noops > 0 or policy != "noop"
