"""Contract checks of issue 15 items 2 and 7: masked-action policies and per-env seeds.

Masked actions (``serve(masked_actions=...)``): a server started with ``--masked-actions
pass`` steps an env with an action its mask forbids; ``noop`` does not step that env and answers
its previous result with the env's penalty as reward (ContractEnv has none: 0). Both say their
policy in the HELLO info. ``reject`` (the default) is covered by ``check_refused_actions``.
Seeds: RESET_SEEDS_REQ resets env i with its own seed, any list.
"""

from __future__ import annotations

import copy

from transport.testing.checks import (
    SEATS_ENVS,
    CheckContext,
    _check,
    _expect_results,
    _step,
)
from transport.testing.model import ExpectedSession
from transport.testing.servers import ServerOptions


@_check(per_schema=False)
def check_masked_action_policies(ctx: CheckContext) -> None:
    """``--masked-actions pass`` steps the env with a masked action (bytes as the local env's);
    ``noop`` leaves that env's previous result with reward 0 and steps the others; each server
    names its policy in the HELLO info (``client.masked_actions``)."""
    for policy in ("pass", "noop"):
        options = ServerOptions(masked_actions=policy)
        server = ctx.factory(ctx.schema, SEATS_ENVS, options)
        with ctx.connect(server) as client:
            assert client.masked_actions == policy, (
                f"{policy}: the server says {client.masked_actions!r}"
            )
            model = ExpectedSession(ctx.schema, client.num_envs, server_seed=None)
            if model.mask_name is None:
                return  # the schema has no mask: nothing is masked
            _expect_results(client.reset(21), model.reset(21), f"{policy}: reset")
            last = client.num_envs - 1
            actions = [0] * client.num_envs
            actions[last] = model.act_n - 1  # ContractEnv masks act_n - 1 always
            env_before = copy.deepcopy(model.envs[last])
            previous = model.results[last]
            assert previous is not None
            results, _, failed = model.step(actions)
            assert not failed
            if policy == "noop":  # env `last` did not step: its previous result, reward 0
                model.envs[last] = env_before
                kept = previous.copy()
                reward = model.codec.ir.role("reward")
                if reward is not None:
                    kept[reward.name] = 0
                model.results[last] = kept
                results = [r for r in model.results if r is not None]
            what = f"{policy}: a step with a masked action on env {last}"
            _expect_results(_step(client, actions), results, what)
            actions = [0] * client.num_envs
            if model.refusal(actions) is not None:  # an env may have ended
                _expect_results(client.reset(23), model.reset(23), f"{policy}: reset")
            results, _, _ = model.step(actions)
            _expect_results(_step(client, actions), results, f"{policy}: the next step")


@_check(per_schema=False)
def check_reset_with_a_seed_per_env(ctx: CheckContext) -> None:
    """RESET_SEEDS: ``client.reset([s0, None, s2, ...])`` resets env i with its own seed (None:
    unseeded, continuing its stream), any list, not only s, s+1, ...; bytes as the local envs'."""
    server = ctx.factory(ctx.schema, SEATS_ENVS, ServerOptions())
    with ctx.connect(server) as client:
        model = ExpectedSession(ctx.schema, client.num_envs, server_seed=None)
        _expect_results(client.reset(4), model.reset(4), "reset(4)")
        seeds = [None if i % 3 == 1 else 1000 - 7 * i for i in range(client.num_envs)]
        expected = [env.reset(seed) for env, seed in zip(model.envs, seeds, strict=True)]
        model.results = list(expected)
        _expect_results(client.reset(seeds), expected, f"reset({seeds})")
        actions = [0] * client.num_envs
        results, _, _ = model.step(actions)
        _expect_results(_step(client, actions), results, "a step after reset(seeds)")
