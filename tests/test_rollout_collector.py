"""transport.rollout (issue 25 item 3): the batched collector over a real shm server.

The buffer must hold exactly what the plain NumPy client sees when it replays the same
actions from the same seed: observations, masks, rewards and end flags (the final result's
for an ended episode: same_step auto-reset), and the episode returns the rewards add up to.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import transport  # noqa: E402
import transport.torch as tt  # noqa: E402
from transport.errors import AdapterError  # noqa: E402
from transport.rollout import RolloutCollector  # noqa: E402

from .servers import ROOT, ServerProcess, unique_url  # noqa: E402

TETRIS = str(ROOT / "schema" / "tetris.toml")
N = 4
T = 16
CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device"))]


def host(tensor: Any) -> np.ndarray:
    return np.asarray(tensor.detach().cpu().numpy()).copy()


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    url = unique_url("shm")
    with ServerProcess(url, env="contract", num_envs=N, extra=["--schema", TETRIS]) as proc:
        yield proc


def policy(obs: Any, mask: Any) -> Any:
    """The largest legal action of each env (never the contract env's poison action 1), and
    one extra per env for the buffer to keep."""
    allowed = mask.clone()
    allowed[:, 1] = False
    actions = (allowed * torch.arange(allowed.shape[1], device=mask.device)).argmax(dim=1)
    return actions, {"value": obs.sum(dim=1)}


FINALS: dict[tuple[int, int], dict[str, np.ndarray]] = {}
"""The last replay's final results by (step, env): what ``buf.finals`` must hold."""


def replay(url: str, actions: np.ndarray) -> dict[str, np.ndarray]:
    """The plain client, same seed and actions: what each buffer row must hold."""
    obs, masks, rewards, term, trunc = [], [], [], [], []
    FINALS.clear()
    with transport.connect(url, TETRIS, autoreset="same_step") as client:
        view = client.reset(seed=11)
        for t in range(actions.shape[0]):
            obs.append(view["observation"].copy())
            masks.append(view["action_mask"].astype(bool))
            view = client.step(actions[t])
            reward = view["reward"].copy()
            done = view["done"].astype(bool)
            truncated = view["truncated"].astype(bool)
            for index, final in client.finals:
                reward[index] = final["reward"]
                done[index] = bool(final["done"])
                truncated[index] = bool(final["truncated"])
                FINALS[(t, index)] = {name: np.array(final[name]) for name in final}
            rewards.append(reward)
            term.append(done & ~truncated)
            trunc.append(truncated)
        next_obs = view["observation"].copy()
    return {
        "observations": np.stack(obs),
        "masks": np.stack(masks),
        "rewards": np.stack(rewards),
        "terminated": np.stack(term),
        "truncated": np.stack(trunc),
        "next_observations": next_obs,
    }


NEEDS_CUDA = pytest.mark.skipif(not CUDA, reason="no CUDA device")


@pytest.mark.parametrize(
    ("device", "graph"),
    [
        ("cpu", False),
        pytest.param("cuda", False, marks=NEEDS_CUDA),
        pytest.param("cuda", True, marks=NEEDS_CUDA),
    ],
    ids=["cpu", "cuda", "cuda-graph"],
)
def test_buffer_equals_the_numpy_replay(server: ServerProcess, device: str, graph: bool) -> None:
    with tt.connect(server.url, TETRIS, device=device, autoreset="same_step") as client:
        collector = RolloutCollector(client, policy, T, seed=11, cuda_graph=graph)
        buf = collector.collect()
        assert buf.observations.shape == (T, N, 214)
        assert buf.masks.shape == (T, N, 40) and buf.masks.dtype == torch.bool
        assert buf.actions.shape == (T, N)
        assert buf.extras["value"].shape == (T, N)
        assert torch.equal(buf.extras["value"], buf.observations.sum(dim=2))
        assert buf.rewards.device.type == device and buf.observations.device.type == device
        actions = host(buf.actions)
        got = {
            name: host(getattr(buf, name))
            for name in (
                "observations",
                "masks",
                "rewards",
                "terminated",
                "truncated",
                "next_observations",
            )
        }
        finals = [(t, i) for t, i, _ in buf.finals]
        final_values = {
            (t, i): {name: host(step[name]) for name in step} for t, i, step in buf.finals
        }
        returns, lengths = list(buf.episode_returns), list(buf.episode_lengths)
        assert collector.total_steps == T * N
    want = replay(server.url, actions)
    for name, value in want.items():
        assert np.array_equal(got[name], value), name
    dones = want["terminated"] | want["truncated"]
    assert dones.any()  # the contract env's episodes are 2-7 steps: several ended
    assert finals == [tuple(pair) for pair in np.argwhere(dones).tolist()]
    for key, values in final_values.items():  # each final result's fields, on its device
        for name, value in values.items():
            assert np.array_equal(value, FINALS[key][name]), (key, name)
    # returns of the episodes that started at the reset and ended in the rollout, in order
    expected_returns, running, length = [], np.zeros(N), np.zeros(N, dtype=int)
    for t in range(T):
        running += want["rewards"][t]
        length += 1
        for i in np.flatnonzero(dones[t]):
            expected_returns.append((float(running[i]), int(length[i])))
            running[i], length[i] = 0.0, 0
    assert list(zip(returns, lengths, strict=True)) == expected_returns


def test_buffer_is_reused_and_episodes_continue(server: ServerProcess) -> None:
    with tt.connect(server.url, TETRIS, device="cpu", autoreset="same_step") as client:
        collector = RolloutCollector(client, policy, 4, seed=11)
        first = collector.collect()
        observations = first.observations
        second = collector.collect()
        assert second is first and second.observations is observations
        assert collector.total_steps == 8 * N


def test_cuda_graph_needs_a_cuda_client(server: ServerProcess) -> None:
    with tt.connect(server.url, TETRIS, device="cpu", autoreset="same_step") as client:
        with pytest.raises(AdapterError, match="cuda_graph=True needs a CUDA client"):
            RolloutCollector(client, policy, 4, cuda_graph=True)


def test_refuses_a_client_without_same_step(server: ServerProcess) -> None:
    with tt.connect(server.url, TETRIS) as client:
        with pytest.raises(AdapterError, match="same_step"):
            RolloutCollector(client, policy, 4)
        with pytest.raises(ValueError, match="at least 1"):
            RolloutCollector(client, policy, 0)


def test_ppo_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """examples/train_rollout_ppo.py end to end (its own pac server), a few updates."""
    import importlib.util

    path = ROOT / "examples" / "train_rollout_ppo.py"
    spec = importlib.util.spec_from_file_location("train_rollout_ppo", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()  # the example sets torch's threads: restored after
    try:
        argv = ["--env", "pac", "--num-envs", "4", "--steps", "32", "--timesteps", "256"]
        assert module.main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert out.count("progress: steps=") == 2
    assert "done: env=pac device=" in out


@pytest.mark.parametrize("device", DEVICES)
def test_dict_observations_and_box_actions(device: str) -> None:
    """A Dict observation (two fields) and a Box action (the reach env, schema dictbox): the
    buffer keeps a dict of observation tensors, and equals the NumPy replay."""
    url = unique_url("shm")
    steps = 8
    rng = torch.Generator().manual_seed(0)

    def reach(obs: Any, mask: Any) -> Any:
        assert set(obs) == {"grid", "vec"} and mask is None
        return torch.rand((N, 2), generator=rng) * 2 - 1

    with ServerProcess(url, env="reach", num_envs=N) as proc:
        with tt.connect(proc.url, device=device, autoreset="same_step") as client:
            buf = RolloutCollector(client, reach, steps, seed=5).collect()
            assert buf.observations["grid"].shape == (steps, N, 2, 5, 5)
            assert buf.observations["vec"].shape == (steps, N, 4)
            assert buf.next_observations["vec"].shape == (N, 4) and buf.masks is None
            actions = host(buf.actions)
            got = {name: host(buf.observations[name]) for name in ("grid", "vec")}
            rewards = host(buf.rewards)
        with transport.connect(proc.url, autoreset="same_step") as plain:
            view = plain.reset(seed=5)
            for t in range(steps):
                for name in ("grid", "vec"):
                    assert np.array_equal(got[name][t], view[name]), (name, t)
                view = plain.step(actions[t])
                want = view["reward"].astype(np.float32)
                for index, final in plain.finals:
                    want[index] = final["reward"]
                assert np.array_equal(rewards[t], want), t


class _StageClient:
    """A host stand-in for a CUDA ``TorchClient`` as ``_stage_finals`` uses it: the device a
    CPU one, the runtime's ``cudaMemcpyAsync`` a ``memmove`` (or None: torch's ``copy_``)."""

    def __init__(self, runtime: bool) -> None:
        self.device = torch.device("cpu")
        self.num_envs = 7
        self._runtime = self if runtime else None
        self.marked: list[int | None] = []

    def copy(self, target: int, source: int, nbytes: int, stream: int) -> None:
        ctypes.memmove(target, source, nbytes)

    def _stream(self) -> int:
        return 5

    def _mark_copied(self, stream: int | None) -> None:
        self.marked.append(stream)


@pytest.mark.parametrize("runtime", [True, False], ids=["runtime-copy", "torch-copy"])
@pytest.mark.parametrize("packed", [False, True], ids=["natural", "packed"])
def test_staged_finals_hold_each_field_of_each_final(runtime: bool, packed: bool) -> None:
    """The CUDA finals path on the host: the ended envs' records stacked into the pinned stage,
    ONE copy of their bytes to a fresh block, each field a view of it (an unaligned field of
    a packed record an owned copy), row k of each the k-th final, bit for bit; the copy is
    marked on the client (its next request waits for it before the stage is reused)."""
    from transport.rollout import _FinalRow, _FinalsStage

    fields = [
        ("obs", "<f4", (3, 2)),
        ("mask", "u1", (5,)),
        ("reward", "<f4"),
        ("none", "<f4", (0,)),
        ("n", "<i8"),
    ]
    dtype = np.dtype(fields, align=not packed)
    records = np.zeros(7, dtype=dtype)
    rng = np.random.default_rng(3)
    for name in dtype.names or ():
        records[name] = rng.integers(0, 50, size=records[name].shape)
    ended = [1, 4, 6]
    client = _StageClient(runtime)
    collector: Any = RolloutCollector.__new__(RolloutCollector)
    collector.client = client
    collector._staged = True  # the CUDA branch
    collector._finals_stage = None
    collector._final_fields = None
    blocks = []
    for step in range(2):  # the stage is reused; each step's block is its own
        stacked = records[ended] if step == 0 else records[ended[1:2]]  # and one alone
        staged = collector._final_records(dtype, len(stacked))
        assert isinstance(collector._finals_stage, _FinalsStage)
        for k in range(len(stacked)):
            staged[k] = stacked[k]
        finals = collector._stack_finals(staged)
        blocks.append((finals, stacked))
    assert client.marked == ([5, 5] if runtime else [None, None])
    for finals, stacked in blocks:
        for k in range(len(stacked)):
            row = _FinalRow(finals, k)
            assert list(row) == list(dtype.names or ())
            for name in dtype.names or ():
                assert np.array_equal(row[name].numpy(), stacked[k][name]), name


def test_finals_outlive_the_next_collect_and_close(server: ServerProcess) -> None:
    """A final result kept from one collect reads the same values after the next collect
    and after the client is closed (each step's finals own their block: never the stage, never
    the slots)."""
    with tt.connect(server.url, TETRIS, device="cpu", autoreset="same_step") as client:
        collector = RolloutCollector(client, policy, T, seed=11)
        kept = list(collector.collect().finals)
        assert kept
        before = [{name: host(step[name]) for name in step} for _, _, step in kept]
        collector.collect()
        after_next = [{name: host(step[name]) for name in step} for _, _, step in kept]
    after_close = [{name: host(step[name]) for name in step} for _, _, step in kept]
    for want, got, closed in zip(before, after_next, after_close, strict=True):
        for name, value in want.items():
            assert np.array_equal(got[name], value) and np.array_equal(closed[name], value), name


def test_flags_of_a_schema_without_truncated() -> None:
    """pac_env's result has ``done`` and no ``truncated`` field: every end is a termination
    (``truncated`` all False), rewards and flags of ended envs from their final results, as
    the plain client's replay of the same actions gives them."""
    url = unique_url("shm")
    schema = str(ROOT / "schema" / "pac_env.toml")
    with ServerProcess(url, env="contract", num_envs=N, extra=["--schema", schema]) as proc:
        with tt.connect(proc.url, schema, device="cpu", autoreset="same_step") as client:
            collector = RolloutCollector(client, policy, T, seed=3)
            assert collector.truncated_name is None and collector.ended_is_done
            buf = collector.collect()
            actions = host(buf.actions)
            got = {name: host(getattr(buf, name)) for name in ("rewards", "terminated", "dones")}
            assert not buf.truncated.any()
            finals = [(t, i) for t, i, _ in buf.finals]
        with transport.connect(proc.url, schema, autoreset="same_step") as plain:
            plain.reset(seed=3)
            ends = []
            for t in range(T):
                view = plain.step(actions[t])
                reward = view["reward"].astype(np.float32)
                done = view["done"] != 0
                for index, final in plain.finals:
                    reward[index] = final["reward"]
                    done[index] = final["done"] != 0
                    ends.append((t, index))
                assert np.array_equal(got["rewards"][t], reward), t
                assert np.array_equal(got["terminated"][t], done), t
                assert np.array_equal(got["dones"][t], done), t
    assert ends and finals == ends


def test_episodes_continue_across_collects(server: ServerProcess) -> None:
    """Two collects of T steps give the episodes (returns, lengths, in order) of one collect
    of 2T steps from the same reset: an episode that spans the two is counted whole."""
    got: list[tuple[float, int]] = []
    with tt.connect(server.url, TETRIS, device="cpu", autoreset="same_step") as client:
        collector = RolloutCollector(client, policy, T, seed=11)
        for _ in range(2):
            buf = collector.collect()
            got += list(zip(buf.episode_returns, buf.episode_lengths, strict=True))
    with tt.connect(server.url, TETRIS, device="cpu", autoreset="same_step") as client:
        buf = RolloutCollector(client, policy, 2 * T, seed=11).collect()
        want = list(zip(buf.episode_returns, buf.episode_lengths, strict=True))
    assert want and got == want
    assert any(length > 1 for _, length in want)
