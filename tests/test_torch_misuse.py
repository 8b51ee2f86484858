"""transport.torch with the inputs a QA pass found mishandled (2026-11-27).

- A bfloat16 action tensor (an autocast policy's output) is widened to float32 and judged by
  the client's action rule as a float16 tensor is; a tensor on a device other than the CPU
  and CUDA is copied to the CPU, and one that holds no data (meta) is an ``ActionError``
  naming the device (they were torch's ``TypeError`` / the CUDA pinned-buffer ``RuntimeError``).
- A schema derived from gymnasium spaces is packed: a field whose offset is no multiple of its
  element size (Pendulum-v1's f8 reward after f32[3]) is copied on the CPU even over shm, and
  the repr says which fields are (it said ``path=zero-copy views``); docs/torch.md says when.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

torch = pytest.importorskip("torch")

import transport.torch as tt  # noqa: E402
from transport.api import Server  # noqa: E402
from transport.errors import ActionError  # noqa: E402
from transport.gym_serve import gym_server  # noqa: E402

from .servers import ROOT, unique_url  # noqa: E402

N = 2


class ActionEcho(gymnasium.Env[np.ndarray, np.ndarray]):
    """Observes the action it was given (f32[2]): what the server received, bit for bit."""

    observation_space = spaces.Box(-1e4, 1e4, (2,), np.float32)
    action_space = spaces.Box(-1e4, 1e4, (2,), np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return np.asarray(action, np.float32).copy(), 0.0, False, False, {}


@pytest.fixture(scope="module")
def echo() -> Iterator[Server]:
    with gym_server(ActionEcho, unique_url("unix"), num_envs=N).start() as server:
        yield server


@pytest.fixture(scope="module")
def cartpole() -> Iterator[Server]:
    with gym_server("CartPole-v1", unique_url("unix"), num_envs=N).start() as server:
        yield server


def received(client: tt.TorchClient, actions: Any) -> np.ndarray:
    return np.asarray(client.step(actions).observation.numpy()).copy()


def test_bfloat16_actions_are_widened_exactly(echo: Server) -> None:
    """bfloat16 values (every one exact in float32) reach a float field unchanged, as float16
    ones do; an autocast policy's output is taken as it is."""
    values = [[0.5, -1.25], [3.0, 1e3 + 8]]  # bfloat16 holds each exactly
    with tt.connect(echo.bound_url, device="cpu") as client:
        client.reset(seed=0)
        for dtype in (torch.bfloat16, torch.float16):
            got = received(client, torch.tensor(values, dtype=dtype))
            assert np.array_equal(got, np.array(values, np.float32)), dtype
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = torch.nn.Linear(3, 2)(torch.randn(N, 3))
        assert out.dtype == torch.bfloat16
        assert np.array_equal(received(client, out), out.float().detach().numpy())
        strided = torch.tensor(values, dtype=torch.bfloat16).t().contiguous().t()  # any strides
        assert np.array_equal(received(client, strided), np.array(values, np.float32))


def test_bfloat16_actions_into_an_integer_field_are_refused_as_float16(cartpole: Server) -> None:
    with tt.connect(cartpole.bound_url, device="cpu") as client:
        client.reset(seed=0)
        for dtype in (torch.float16, torch.bfloat16):
            with pytest.raises(ActionError, match="truncated"):
                client.step(torch.ones(N, dtype=dtype))
        client.step(torch.ones(N, dtype=torch.int64))  # the client is unharmed


def test_a_tensor_without_data_is_an_action_error_naming_its_device(echo: Server) -> None:
    with tt.connect(echo.bound_url, device="cpu") as client:
        client.reset(seed=0)
        with pytest.raises(ActionError, match=r"device meta.*pass a tensor on the CPU"):
            client.step(torch.zeros(N, 2, device="meta"))
        got = received(client, torch.ones(N, 2))  # the client is unharmed
        assert np.array_equal(got, np.ones((N, 2), np.float32))


class Elsewhere(torch.Tensor):  # type: ignore[name-defined,misc]
    """A stand-in for a tensor on MPS or XLA (not on this machine): it says it is on "mps"
    and counts its copies to the CPU."""

    moved = 0

    @property
    def device(self) -> Any:
        return torch.device("mps")

    def cpu(self, *args: Any, **kwargs: Any) -> Any:
        Elsewhere.moved += 1
        return torch.Tensor.cpu(self.as_subclass(torch.Tensor), *args, **kwargs)


def test_a_tensor_on_another_device_is_copied_to_the_cpu(echo: Server) -> None:
    values = [[1.5, -2.0], [0.25, 7.0]]
    with tt.connect(echo.bound_url, device="cpu") as client:
        client.reset(seed=0)
        for dtype in (torch.float32, torch.bfloat16):
            before = Elsewhere.moved
            actions = torch.tensor(values, dtype=dtype).as_subclass(Elsewhere)
            assert actions.device.type == "mps"
            got = received(client, actions)
            assert Elsewhere.moved == before + 1, dtype
            assert np.array_equal(got, np.array(values, np.float32)), dtype


def test_a_dtype_numpy_cannot_hold_is_an_action_error(echo: Server) -> None:
    with tt.connect(echo.bound_url, device="cpu") as client:
        client.reset(seed=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch: "ComplexHalf support is experimental"
            actions = torch.zeros(N, 2, dtype=torch.complex32)
        with pytest.raises(ActionError, match="complex32"):
            client.step(actions)


@pytest.mark.parametrize(
    ("source", "url", "layout", "copied"),
    [
        ("Pendulum-v1", "shm", "slots", ["reward"]),  # f8 at offset 12 of a packed record
        ("Pendulum-v1", "shm", "columns", []),
        ("CartPole-v1", "shm", "slots", []),  # f8 at offset 16
        ("CartPole-v1", "unix", "slots", ["observation", "reward"]),  # 26-byte records
    ],
    ids=["pendulum-shm", "pendulum-columns", "cartpole-shm", "cartpole-unix"],
)
def test_copied_fields_of_derived_layouts_are_named_in_the_repr(
    source: str, url: str, layout: str, copied: list[str]
) -> None:
    """What docs/torch.md says of gymnasium-derived (packed) schemas, and the repr says it too:
    a copied field is never described as a zero-copy view."""
    with gym_server(source, unique_url(url), num_envs=4, shm_layout=layout).start() as server:
        with tt.connect(server.bound_url, device="cpu") as client:
            assert "of aligned fields" in repr(client)  # no result seen: nothing is claimed
            result = client.reset(seed=0)
            assert client.copied_fields == copied
            text = repr(client)
            view = client.view
            assert view is not None
            for name in result:
                is_view = result[name].data_ptr() == view[name].__array_interface__["data"][0]
                assert is_view == (name not in copied), name
                assert result[name].numpy().tobytes() == view[name].tobytes(), name
        if copied:
            assert f"path=zero-copy views except {', '.join(copied)} (unaligned" in text
        else:
            assert text.endswith("path=zero-copy views)"), text
        assert client.copied_fields == copied  # still said after close


def test_the_docs_say_when_derived_layouts_are_copied() -> None:
    """docs/torch.md no longer claims every derived layout is viewed over shm."""
    text = " ".join((ROOT / "docs" / "torch.md").read_text().split())
    assert "every derived layout" not in text
    assert "Pendulum-v1" in text and "copied_fields" in text and "packed" in text
