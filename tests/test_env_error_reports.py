"""An env that raises is reported: the server logs its traceback (or JS stack) with the env and
the request once, and the client's EnvError carries the last frames (issue 15 item 3)."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import numpy as np
import pytest

import transport
from transport.envs import env_factory, env_schema
from transport.errors import REMOTE_TRACEBACK_MARKER, EnvError
from transport.protocol import AutoReset, RequestError
from transport.runtime.core import ENV_ERROR_TEXT_MAX, remote_traceback, with_traceback
from transport.schema.compiler import ERROR_TEXT_SIZE
from transport.testing import POISON_ACTION, schema_named

from .servers import NODE_SERVER, ROOT, ServerProcess, unique_url

SCHEMES = ["unix", "shm"]  # a stream ERROR text, and the shm slot's error text area


@pytest.mark.parametrize("lang", ["python", "node"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_env_error_is_logged_once_and_carries_its_traceback(scheme: str, lang: str) -> None:
    schema = schema_named("pac_env")
    server = ServerProcess(
        unique_url(scheme), env="contract", lang=lang, extra=["--schema", "pac_env"]
    )
    with server:
        with transport.connect(server.url, schema, timeout=20.0) as client:
            client.reset(5)
            with pytest.raises(EnvError) as caught:
                client.step(POISON_ACTION)
            client.step(0)  # the env was reset: the connection goes on
        error = caught.value
        assert error.env_id == 0
        assert error.text.startswith("env 0: ") and error.text.endswith("(the env was reset)")
        assert REMOTE_TRACEBACK_MARKER not in error.text
        assert "poison action" in error.remote_traceback, error.remote_traceback
        assert "contract" in error.remote_traceback  # a frame of the env's own file
        assert str(error).endswith(error.remote_traceback)
        assert len(str(error.text + REMOTE_TRACEBACK_MARKER + error.remote_traceback).encode()) <= (
            ENV_ERROR_TEXT_MAX
        )
        server.terminate()
        assert server.proc.stderr is not None
        log = server.proc.stderr.read()
    line = f"transport: env 0 raised during STEP action {POISON_ACTION} (the env was reset)"
    assert log.count(line) == 1, log
    after = log[log.index(line) :]
    assert "poison action" in after and "contract" in after, log  # the whole traceback / stack


def test_env_error_text_bound_is_the_shm_error_area() -> None:
    """Every backend carries the same text: the bound is the smallest carrier's."""
    assert ENV_ERROR_TEXT_MAX == ERROR_TEXT_SIZE


def test_with_traceback_keeps_the_last_lines_within_the_bound() -> None:
    trace = "".join(f"  File 'f{i}.py', line {i}, in g{i}\n    call{i}()\n" for i in range(200))
    trace += "ValueError: the last line"
    text = with_traceback("env 3: ValueError: boom (the env was reset)", trace)
    assert len(text.encode()) <= ENV_ERROR_TEXT_MAX
    message, _, kept = text.partition(REMOTE_TRACEBACK_MARKER)
    assert message == "env 3: ValueError: boom (the env was reset)"
    assert kept.startswith("  ...\n  File") and kept.endswith("ValueError: the last line")
    assert with_traceback("x" * 2000, trace) == "x" * 2000  # no room: the message alone
    assert with_traceback("m", "") == "m"


def test_remote_traceback_names_the_env_frames() -> None:
    def env_step() -> None:
        raise KeyError("missing")

    try:
        env_step()
    except KeyError as exc:
        trace = remote_traceback(exc)
    assert "in env_step" in trace and trace.endswith("KeyError: 'missing'")
    assert remote_traceback(ValueError("never raised")) == ""


# -- SB3: on_env_error="truncate" ------------------------------------------------------------

SB3_ENVS = 4


def _sb3_server(lang: str) -> ServerProcess:
    pytest.importorskip("stable_baselines3")
    return ServerProcess(
        unique_url("unix"),
        env="contract",
        lang=lang,
        num_envs=SB3_ENVS,
        extra=["--schema", "pac_env"],
    )


def _safe_actions() -> np.ndarray:
    """Action 0 for every env: the contract env's mask always allows it and it never raises."""
    return np.zeros(SB3_ENVS, dtype=np.int64)


@pytest.mark.parametrize("lang", ["python", "node"])
def test_sb3_truncate_ends_the_failed_env_episode(lang: str) -> None:
    from transport.sb3 import RemoteVecEnv

    with _sb3_server(lang) as server:
        venv = RemoteVecEnv(server.url, SB3_ENVS, schema=schema_named("pac_env"))
        try:
            venv.reset()
            actions = _safe_actions()
            actions[1] = POISON_ACTION
            with pytest.raises(EnvError):  # the default: raise
                venv.step(actions)
        finally:
            venv.close()
        venv = RemoteVecEnv(
            server.url, SB3_ENVS, schema=schema_named("pac_env"), on_env_error="truncate"
        )
        try:
            venv.reset()
            step = venv.step(actions)
            obs, rewards, dones, infos = np.asarray(step[0]), step[1], step[2], step[3]
            assert dones.tolist() == [False, True, False, False]
            assert infos[1]["TimeLimit.truncated"] is True
            assert infos[1]["env_error"].startswith("env 1: ") and "poison" in infos[1]["env_error"]
            assert rewards[1] == 0.0
            np.testing.assert_array_equal(infos[1]["terminal_observation"], obs[1])
            assert not any("env_error" in infos[i] for i in (0, 2, 3))
            obs = np.asarray(venv.step(_safe_actions())[0])
            assert obs.shape == (SB3_ENVS, 612)  # the next step works
        finally:
            venv.close()


def test_sb3_learn_goes_on_after_env_errors() -> None:
    """MaskablePPO.learn() over a VecEnv whose env 0 is sent the poison action every 16 steps."""
    pytest.importorskip("sb3_contrib")
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import VecEnvWrapper

    from transport.sb3 import RemoteVecEnv

    class PoisonEnvZero(VecEnvWrapper):
        """Replaces env 0's action with the poison action every 16th step; counts the errors."""

        def __init__(self, venv: RemoteVecEnv) -> None:
            super().__init__(venv)
            self.steps = 0
            self.errors = 0

        def reset(self) -> Any:
            return self.venv.reset()

        def step_async(self, actions: np.ndarray) -> None:
            self.steps += 1
            actions = np.array(actions)
            if self.steps % 16 == 0:
                actions[0] = POISON_ACTION
            self.venv.step_async(actions)

        def step_wait(self) -> Any:
            obs, rewards, dones, infos = self.venv.step_wait()
            self.errors += sum("env_error" in info for info in infos)
            return obs, rewards, dones, infos

    with _sb3_server("python") as server:
        venv = RemoteVecEnv(
            server.url, SB3_ENVS, schema=schema_named("pac_env"), on_env_error="truncate"
        )
        wrapped = PoisonEnvZero(venv)
        model = MaskablePPO(
            "MlpPolicy", wrapped, n_steps=32, batch_size=64, n_epochs=1, seed=0, device="cpu"
        )
        model.learn(total_timesteps=256)
        wrapped.close()
    assert model.num_timesteps >= 256
    assert wrapped.errors >= 3


NODE_POISON_CLIENT = """
const { connect, EnvError } = require(process.argv[1]);
(async () => {
  const client = await connect(process.argv[2], { timeoutMs: 20000 });
  await client.reset(5n);
  try {
    await client.step(Number(process.argv[3]));
    console.log(JSON.stringify("answered"));
  } catch (error) {
    console.log(JSON.stringify({
      envError: error instanceof EnvError, envId: error.envId, text: error.text,
      remoteTraceback: error.remoteTraceback, message: error.message,
    }));
  }
  await client.step(0); // the env was reset: the connection goes on
  await client.close();
})().catch((error) => { console.log(JSON.stringify(`failed: ${error.stack}`)); process.exit(1); });
"""


@pytest.mark.parametrize("lang", ["python", "node"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_node_client_env_error_carries_the_traceback(scheme: str, lang: str) -> None:
    if shutil.which("node") is None or not NODE_SERVER.is_file():
        pytest.skip("the Node bridge is not built (run ./dev setup)")
    server = ServerProcess(
        unique_url(scheme), env="contract", lang=lang, extra=["--schema", "pac_env"]
    )
    with server:
        index = str(ROOT / "node_bridge" / "dist" / "index.js")
        out = subprocess.run(
            ["node", "-e", NODE_POISON_CLIENT, index, server.url, str(POISON_ACTION)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert isinstance(report, dict), report
    assert report["envError"] and report["envId"] == 0
    assert report["text"].startswith("env 0: ") and REMOTE_TRACEBACK_MARKER not in report["text"]
    assert "poison action" in report["remoteTraceback"]
    assert report["message"].endswith(report["remoteTraceback"])


class PoisonedPac:
    """The pac reference env, raising on POISON_ACTION: a picklable factory for worker processes."""

    def __init__(self) -> None:
        self.env = env_factory("pac")()

    def spaces(self) -> Any:
        return self.env.spaces()

    def reset(self, seed: int | None = None) -> Any:
        return self.env.reset(seed)

    def step(self, action: int) -> Any:
        if action == POISON_ACTION:
            raise ValueError("poison action in a worker")
        return self.env.step(action)


def test_env_error_in_a_worker_process_carries_its_last_frames() -> None:
    """workers > 0: the env raises in a worker process; its last frames ride along to the
    runtime, which puts them after the message and logs them."""
    from transport.generated import pac_env
    from transport.runtime.pool import WorkerPool

    codec = pac_env.SCHEMA["StepResult"]
    dest = codec.view(bytearray(codec.size * 2), 0, count=2)
    pool = WorkerPool(PoisonedPac, env_schema("pac"), "StepResult", 2, 2, dest)
    try:
        assert pool.reset([1, 2]) == []
        _, failures = pool.step([0, POISON_ACTION], AutoReset.DISABLED)
    finally:
        pool.close()
    assert [index for index, _ in failures] == [1]
    error = failures[0][1]
    assert isinstance(error, RequestError)
    message, marker, trace = error.text.partition(REMOTE_TRACEBACK_MARKER)
    assert message == "env 1: ValueError: poison action in a worker" and marker
    assert "in step" in trace and trace.endswith("ValueError: poison action in a worker")
