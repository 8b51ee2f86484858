"""Masked-action policies (issue 15 item 2) against real server processes of both languages.

``reject`` answers MASKED_ACTION; ``pass`` steps the env with the action; ``noop`` does not step
the env and answers its previous result with the env's penalty as reward. Plain SB3 PPO and
gymnasium's ``check_env`` (which ignore masks) run against ``noop`` / ``pass`` servers.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import transport
from transport.api import Server
from transport.envs.pac import PacEnv
from transport.errors import RemoteError
from transport.protocol import ErrorCode
from transport.testing.contract_env import ContractEnv, schema_named

from .servers import LANGS, ROOT, ServerProcess, require_lang, unique_url

PAC = schema_named("pac_env")
MASKED = 91  # ContractEnv masks act_n - 1 always (pac_env: 92 actions)


def contract_server(lang: str, policy: str | None, num_envs: int = 1) -> ServerProcess:
    extra = ["--schema", "pac_env"]
    if policy is not None:
        extra += ["--masked-actions", policy]
    return ServerProcess(
        unique_url("unix"), env="contract", lang=lang, num_envs=num_envs, extra=extra
    )


@pytest.mark.parametrize("lang", LANGS)
def test_reject_is_the_default_and_says_so(lang: str) -> None:
    with contract_server(lang, None) as server, transport.connect(server.url, PAC) as client:
        assert client.masked_actions == "reject"
        assert client.server_info["masked_actions"] == "reject"
        client.reset(3)
        with pytest.raises(RemoteError) as info:
            client.step(MASKED)
        assert info.value.code == ErrorCode.MASKED_ACTION and "env 0" in info.value.text


@pytest.mark.parametrize("lang", LANGS)
def test_pass_steps_the_env_with_the_masked_action(lang: str) -> None:
    local = ContractEnv(PAC)
    with contract_server(lang, "pass") as server, transport.connect(server.url, PAC) as client:
        assert client.masked_actions == "pass"
        client.reset(3)
        local.reset(3)
        got = client.step(MASKED, copy=True)
        want = local.step(MASKED)
        assert got.record.tobytes() == want.tobytes()


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("num_envs", [1, 3])
def test_noop_keeps_the_previous_result_and_does_not_step(lang: str, num_envs: int) -> None:
    """1 env (STEP_REQ) and 3 envs (a batch where only env 1 takes a masked action)."""
    locals_ = [ContractEnv(PAC) for _ in range(num_envs)]
    with (
        contract_server(lang, "noop", num_envs) as server,
        transport.connect(server.url, PAC) as client,
    ):
        assert client.masked_actions == "noop"
        before = client.reset(3, copy=True).record.reshape(-1)
        for i, env in enumerate(locals_):
            env.reset(3 + i)
        masked = min(1, num_envs - 1)
        actions = [0] * num_envs
        actions[masked] = MASKED
        got = client.step(actions[0] if num_envs == 1 else actions, copy=True).record.reshape(-1)
        for i, env in enumerate(locals_):
            if i == masked:
                expected = before[i].copy()
                expected["reward"] = 0.0
                assert got[i].tobytes() == expected.tobytes(), "the masked env's previous result"
            else:
                assert got[i].tobytes() == env.step(0).tobytes()
        # the masked env did not step: its next step is its first
        got = client.step(0 if num_envs == 1 else [0] * num_envs, copy=True).record.reshape(-1)
        assert got[masked].tobytes() == locals_[masked].step(0).tobytes()


class PenalizedPac(PacEnv):
    """pac with a penalty for a masked action under ``noop``."""

    masked_action_penalty = -0.5


def test_noop_reward_is_the_python_envs_penalty() -> None:
    with Server(PenalizedPac, unique_url("unix"), masked_actions="noop").start() as server:
        with transport.connect(server.bound_url) as client:
            first = client.reset(5, copy=True)
            result = client.step(MASKED, copy=True)
            assert float(result["reward"]) == -0.5
            assert not bool(result["done"])
            assert np.array_equal(result["observation"], first["observation"])


def test_noop_reward_is_the_node_envs_penalty(tmp_path: Path) -> None:
    require_lang("node")
    pac_js = json.dumps(str(ROOT / "node_bridge" / "dist" / "envs" / "pac.js"))
    module = tmp_path / "penalized.js"
    module.write_text(
        f"const {{ PacEnv }} = require({pac_js});\n"
        "exports.Penalized = () => Object.assign(new PacEnv(), { maskedActionPenalty: -0.5 });\n"
    )
    extra = ["--masked-actions", "noop"]
    with (
        ServerProcess(
            unique_url("unix"), env=f"{module}:Penalized", lang="node", extra=extra
        ) as server,
        transport.connect(server.url) as client,
    ):
        first = client.reset(5, copy=True)
        result = client.step(MASKED, copy=True)
        assert float(result["reward"]) == -0.5
        assert np.array_equal(result["observation"], first["observation"])


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="reject, pass, noop"):
        Server(PacEnv, unique_url("unix"), masked_actions="ignore")


@pytest.fixture(scope="module", params=LANGS)
def pac_noop_url(request: pytest.FixtureRequest) -> Iterator[str]:
    with ServerProcess(
        unique_url("unix"),
        env="pac",
        lang=request.param,
        num_envs=2,
        extra=["--masked-actions", "noop"],
    ) as server:
        yield server.url


def test_plain_sb3_ppo_learns_against_a_noop_server(pac_noop_url: str) -> None:
    """PPO ignores the mask: most of its random actions are masked (pac reserves 41 of 92)."""
    pytest.importorskip("stable_baselines3")
    from stable_baselines3 import PPO

    from transport.sb3 import RemoteVecEnv

    env = RemoteVecEnv(pac_noop_url)
    try:
        model = PPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu")
        model.learn(total_timesteps=256)
        assert model.num_timesteps >= 256
    finally:
        env.close()


class LenientPac(PacEnv):
    """pac that takes any action: one its mask forbids ends the turn (what ``pass`` is for)."""

    def step_into(self, action: int, out: np.ndarray) -> None:
        super().step_into(action if self._mask[action] else 0, out)


LENIENT_JS = """const {{ PacEnv }} = require({pac_js});
exports.Lenient = () => {{
  const env = new PacEnv();
  const step = env.step.bind(env);
  env.step = (action) => step(env.lastResultMask[action] === 1 ? action : 0);
  const reset = env.reset.bind(env);
  const remember = (result) => {{
    env.lastResultMask = Uint8Array.from(result.action_mask);
    return result;
  }};
  env.reset = (seed) => remember(reset(seed));
  const stepped = env.step;
  env.step = (action) => remember(stepped(action));
  return env;
}};
"""


@contextlib.contextmanager
def lenient_server(lang: str, tmp_path: Path) -> Iterator[str]:
    """A ``pass`` server of ``lang`` serving LenientPac (Node: the same rule in a JS module)."""
    if lang == "python":
        with Server(LenientPac, unique_url("unix"), masked_actions="pass").start() as server:
            yield server.bound_url
        return
    require_lang("node")
    pac_js = json.dumps(str(ROOT / "node_bridge" / "dist" / "envs" / "pac.js"))
    module = tmp_path / "lenient.js"
    module.write_text(LENIENT_JS.format(pac_js=pac_js))
    extra = ["--masked-actions", "pass"]
    with ServerProcess(
        unique_url("unix"), env=f"{module}:Lenient", lang="node", extra=extra
    ) as process:
        yield process.url


@pytest.mark.parametrize("lang", LANGS)
def test_check_env_passes_against_a_pass_server(lang: str, tmp_path: Path) -> None:
    """check_env samples actions without the mask: a ``reject`` server would refuse them."""
    from gymnasium.utils.env_checker import check_env

    from transport.gym import RemoteEnv

    with lenient_server(lang, tmp_path) as url:
        env = RemoteEnv(url)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check_env(env, skip_render_check=True)
            env.reset(seed=1)
            for _ in range(20):  # masked actions are certain among 20 samples of 92
                _, _, terminated, truncated, _ = env.step(env.action_space.sample())
                if terminated or truncated:
                    env.reset()
        finally:
            env.close()


def test_the_mask_check_is_the_only_thing_pass_turns_off() -> None:
    """pass still refuses an action outside 0..act_n-1 (INVALID_ACTION)."""
    with (
        Server(PacEnv, unique_url("unix"), masked_actions="pass").start() as server,
        transport.connect(server.bound_url) as client,
    ):
        client.reset(1)
        with pytest.raises(RemoteError) as info:
            client.step(92)
        assert info.value.code == ErrorCode.INVALID_ACTION


def test_adapters_say_what_to_do_on_a_reject_server() -> None:
    """A masked action through an adapter: MASKED_ACTION, with both ways to change the policy."""
    from transport.gym import RemoteEnv

    with contract_server("python", None) as server:
        env = RemoteEnv(server.url, schema=PAC)
        try:
            env.reset(seed=3)
            with pytest.raises(RemoteError) as info:
                env.step(MASKED)
        finally:
            env.close()
    assert info.value.code == ErrorCode.MASKED_ACTION
    text = str(info.value)
    assert "--masked-actions noop" in text and "masked_actions='noop'" in text
    assert server.url in text and "MaskablePPO" in text


@pytest.mark.parametrize("lang", LANGS)
def test_noop_on_worker_pools(lang: str) -> None:
    """A worker pool (Python processes, Node threads) skips the masked env too."""
    extra = ["--masked-actions", "noop", "--workers", "2"]
    with (
        ServerProcess(unique_url("unix"), env="pac", lang=lang, num_envs=4, extra=extra) as s,
        transport.connect(s.url) as client,
    ):
        first = client.reset(7, copy=True)
        local = [PacEnv() for _ in range(4)]
        for i, env in enumerate(local):
            env.reset(7 + i)
        result = client.step([0, 60, 0, 0], copy=True)  # 60: reserved, always masked
        for i, env in enumerate(local):
            if i == 1:
                assert np.array_equal(result["observation"][i], first["observation"][i])
                assert float(result["reward"][i]) == 0.0
            else:
                want = env.step(0)
                assert np.array_equal(result["observation"][i], want["observation"]), i
        result = client.step([0, 0, 0, 0], copy=True)  # env 1 had not stepped
        want = local[1].step(0)
        assert np.array_equal(result["observation"][1], want["observation"])


def test_noop_penalty_with_python_worker_processes() -> None:
    """The penalty of envs that live in worker processes (asked of one env made at start)."""
    with (
        Server(
            PenalizedPac, unique_url("unix"), num_envs=2, workers=2, masked_actions="noop"
        ).start() as server,
        transport.connect(server.bound_url) as client,
    ):
        first = client.reset(5, copy=True)
        result = client.step([MASKED, 0], copy=True)
        assert float(result["reward"][0]) == -0.5
        assert np.array_equal(result["observation"][0], first["observation"][0])


INT_REWARD = """\
[schema]
name = "intreward"
version = 1

[env]

[structs.StepResult]
fields = [
  { name = "observation", type = "f32[3]", role = "observation" },
  { name = "reward", type = "i16", role = "reward" },
  { name = "done", type = "bool", role = "done" },
  { name = "action_mask", type = "bool[4]", role = "action_mask" },
]

[structs.StepRequest]
fields = [{ name = "action", type = "u8", role = "action" }]
"""


@pytest.mark.parametrize("penalty, fits", [(-0.5, False), (40_000, False), (-3, True)])
def test_a_noop_penalty_an_integer_reward_cannot_hold_is_refused_at_start(
    tmp_path: Path, penalty: float, fits: bool
) -> None:
    """An i16 reward turned a noop's -0.5 into 0 and 40000 into -25536, silently."""
    path = tmp_path / "intreward.toml"
    path.write_text(INT_REWARD)
    schema = transport.load_schema(path)

    class Penalized(ContractEnv):
        masked_action_penalty = penalty

        def __init__(self) -> None:
            super().__init__(schema)

    def serve() -> Server:
        return Server(Penalized, unique_url("unix"), schema=schema, masked_actions="noop")

    if not fits:
        with pytest.raises(
            ValueError,
            match=r"masked_action_penalty = .* does not fit the "
            r"reward field 'reward' \(i16: whole numbers -32768..32767\)",
        ):
            serve()
        return
    server = serve()
    with server.start(), transport.connect(server.bound_url, schema=schema) as client:
        client.reset(5)
        assert int(client.step(3, copy=True)["reward"]) == -3  # ContractEnv masks act_n - 1


INT_REWARD_JS = """\
class Penalized {
  spaces() { return { obsN: 3, actN: 4 }; }
  reset() { return this.result(0); }
  step() { return this.result(1); }
  result(reward) {
    const action_mask = [true, true, true, false];
    return { observation: new Float32Array(3), reward, done: false, action_mask };
  }
}
Penalized.prototype.maskedActionPenalty = PENALTY;
exports.Penalized = Penalized;
"""


@pytest.mark.parametrize("penalty, fits", [(-0.5, False), (-3, True)])
def test_the_node_server_refuses_the_same_penalty(
    tmp_path: Path, penalty: float, fits: bool
) -> None:
    require_lang("node")
    (tmp_path / "intreward.toml").write_text(INT_REWARD)
    module = tmp_path / "penalized.js"
    module.write_text(INT_REWARD_JS.replace("PENALTY", repr(penalty)))
    schema_file = str(tmp_path / "intreward.toml")
    extra = ["--schema", schema_file, "--masked-actions", "noop"]
    env = f"{module}:Penalized"
    if not fits:
        command = [sys.executable, "-m", "transport.tools.serve_cli", unique_url("unix")]
        command += ["--env", env, "--lang", "node", *extra]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode != 0 and done.stderr.count("\n") == 1, done.stderr
        assert (
            'maskedActionPenalty = -0.5 does not fit the reward field "reward" '
            "(i16: whole numbers -32768..32767)" in done.stderr
        )
        return
    schema = transport.load_schema(tmp_path / "intreward.toml")
    with ServerProcess(unique_url("unix"), env=env, lang="node", extra=extra) as server:
        with transport.connect(server.url, schema=schema) as client:
            client.reset(5)
            assert int(client.step(3, copy=True)["reward"]) == -3
