"""Gymnasium adapters: ``RemoteEnv`` (one env) and ``RemoteVectorEnv`` (N envs, one connection).

Install with ``pip install transport[gym]``. Spaces come from the server (``SPACES_REQ``):
observation ``Box(low, high, (obs_n,), float32)`` and action ``Discrete(act_n)``; the bounds are
(-inf, inf) unless given, or known for a reference env (``transport.envs.OBS_BOUNDS``).

The adapters return *copies* of observations (owned arrays): gymnasium code keeps observations
across steps (replay buffers, ``check_env``'s aliasing checks), which views into the client's
receive buffer would break. The zero-copy path is the ``Client`` itself (``transport.connect``).

Which fields mean what is read from the schema's roles: ``observation``, ``action_mask``,
``reward``, ``done`` or ``terminated``, ``truncated``. Every other scalar field of the result
struct is an *info scalar*: ``info[name]`` (``RemoteEnv``) or ``infos[name]`` arrays with
``infos["_" + name]`` masks (``RemoteVectorEnv``).

Configuration: ``url=None`` reads ``$TRANSPORT_URL``; ``num_envs=None`` reads
``$TRANSPORT_NUM_ENVS`` and else takes the server's number of envs (docs/adapters.md).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, SupportsFloat

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from transport.actions import describe_given
from transport.api import connect
from transport.client import DEFAULT_TIMEOUT, Client
from transport.codec import Schema
from transport.errors import ActionError, AdapterError, NoProgressError, RemoteError
from transport.protocol import DEFAULT_MAX_BODY, ErrorCode
from transport.spaces import (
    action_field_of,
    action_space_of,
    actions_of,
    gym_description_of,
    observation_of,
    observation_space_of,
)
from transport.step_view import StepView

URL_ENV = "TRANSPORT_URL"
NUM_ENVS_ENV = "TRANSPORT_NUM_ENVS"

Bounds = tuple[float, float]


def resolve_url(url: str | None) -> str:
    """``url``, or ``$TRANSPORT_URL`` when it is None."""
    if url is not None:
        return url
    env_url = os.environ.get(URL_ENV)
    if not env_url:
        raise AdapterError(f"no URL given and ${URL_ENV} is not set")
    return env_url


def resolve_num_envs(num_envs: int | None) -> int | None:
    """``num_envs``, or ``$TRANSPORT_NUM_ENVS`` when it is None (None: take the server's)."""
    if num_envs is not None:
        return num_envs
    text = os.environ.get(NUM_ENVS_ENV)
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise AdapterError(f"${NUM_ENVS_ENV}={text!r} is not an integer") from None
    return value


SERVE_HINT = (
    "the server's num_envs sets it: transport.serve(..., num_envs={n}) in a script, "
    "`transport-serve URL --num-envs {n}` from the shell, or shm://NAME?num_envs={n}"
)


def check_num_envs(client: Client, num_envs: int | None) -> int:
    """The server's number of envs; a clear error when the caller expects another."""
    if num_envs is not None and num_envs != client.num_envs:
        raise AdapterError(
            f"{client.url} serves {client.num_envs} env(s) per connection, the adapter was asked"
            f" for {num_envs}: pass num_envs={client.num_envs} (or None: the server's count), or "
            + SERVE_HINT.format(n=num_envs)
        )
    return client.num_envs


def check_single_env(client: Client) -> None:
    """``RemoteEnv`` plays one env: a clear error, with what to use instead, when there are more."""
    if client.num_envs != 1:
        raise AdapterError(
            f"{client.url} serves {client.num_envs} envs per connection and RemoteEnv plays one: "
            f"use transport.gym.RemoteVectorEnv or transport.sb3.RemoteVecEnv for all "
            f"{client.num_envs}, or serve one env per connection (" + SERVE_HINT.format(n=1) + ")"
        )


def check_autoreset(client: Client, wire: str) -> None:
    """A client given to an adapter must have been connected with the mode the adapter needs."""
    mode = str(client.server_info.get("autoreset", ""))
    if mode != wire:
        raise AdapterError(
            f"{client.url}: the client was connected with autoreset {mode or 'unknown'!r}; this "
            f"adapter needs {wire!r} (transport.connect(url, autoreset={wire!r}))"
        )


MASKED_HINT = (
    "{url} rejects masked actions (its masked-actions policy is 'reject'): a trainer that "
    "ignores action_masks() (plain SB3 PPO, gymnasium's check_env) needs a server started with "
    "`transport-serve URL --masked-actions noop` (or pass), or transport.serve(..., "
    "masked_actions='noop') in a script; sb3-contrib's MaskablePPO works with 'reject' "
    "(docs/adapters.md)"
)


def step_explained(client: Any, actions: Any) -> StepView:
    """``client.step(actions)``; a MASKED_ACTION error gets what to do about it appended."""
    try:
        view: StepView = client.step(actions)
    except RemoteError as exc:
        if exc.code != ErrorCode.MASKED_ACTION:
            raise
        hint = MASKED_HINT.format(url=client.url)
        raise type(exc)(exc.code, exc.name, f"{exc.text}. {hint}") from exc
    return view


RENDER_MODES = ["rgb_array"]
"""What the adapters render: frames the env serves in its ``info()`` map (``frame_of``)."""
FRAME_HELP = (
    "an env that renders returns, from info(), 'frame': the rgb_array frame as bytes (uint8, "
    "row-major) with 'frame_shape': [height, width, 3] (or 'frame' as nested lists)"
)
GYM_FRAME_HELP = (
    "the server's gymnasium envs serve frames only when made with render_mode 'rgb_array' "
    "(made without one, or with 'human' or 'ansi', they serve none): start the server "
    """with `transport-serve URL --gym ENV_ID --gym-kwargs '{"render_mode": "rgb_array"}'` """
    """(in a script: serve_gym(..., gym_kwargs={"render_mode": "rgb_array"}))"""
)


RENDER_MAX_BODY = 1 << 30
"""The ``max_body`` an adapter with ``render_mode="rgb_array"`` connects with unless given one:
``render()`` gets every env's frame in one reply (96 Pendulum frames are 72 MB, over the
default 64 MiB); the client's buffer grows only with replies that come."""


def max_body_for(max_body: int | None, render_mode: str | None) -> int:
    """``max_body``, else ``RENDER_MAX_BODY`` for an adapter that renders, else the default."""
    if max_body is not None:
        return max_body
    return RENDER_MAX_BODY if render_mode is not None else DEFAULT_MAX_BODY


def no_frame_help(schema: Schema | None) -> str:
    """What to do about an env that serves no frame: a server of gymnasium envs (a schema
    derived from gymnasium spaces that says so) needs a render mode; else both hints."""
    if schema is not None and gym_description_of(schema) is not None:
        return GYM_FRAME_HELP
    return f"{FRAME_HELP}; for a server started with --gym (serve_gym): {GYM_FRAME_HELP}"


def check_render_mode(render_mode: str | None) -> str | None:
    """``render_mode`` if the adapters can render it (None or "rgb_array"); else AdapterError."""
    if render_mode is not None and render_mode not in RENDER_MODES:
        raise AdapterError(
            f"render_mode={render_mode!r}: the remote adapters render 'rgb_array' frames (or None)"
        )
    return render_mode


def frame_of(info: dict[str, Any], where: str, schema: Schema | None = None) -> np.ndarray:
    """The rgb_array frame an env's ``info()`` map carries (see ``FRAME_HELP``); ``schema``
    (the server's) picks the advice when there is none (``no_frame_help``)."""
    frame = info.get("frame")
    if frame is None:
        raise AdapterError(f"{where}: the env's info() map has no 'frame': {no_frame_help(schema)}")
    try:
        if isinstance(frame, bytes | bytearray | memoryview):
            shape = tuple(int(n) for n in info["frame_shape"])
            image = np.frombuffer(frame, dtype=np.uint8).reshape(shape).copy()
        else:
            image = np.asarray(frame, dtype=np.uint8)
    except (KeyError, TypeError, ValueError) as exc:
        raise AdapterError(
            f"{where}: the env's frame is not an image ({exc}): {FRAME_HELP}"
        ) from None
    if image.ndim != 3 or image.shape[2] != 3:
        raise AdapterError(f"{where}: the env's frame has shape {image.shape}: {FRAME_HELP}")
    return image


def check_no_options(options: dict[str, Any] | None, who: str) -> None:
    """``reset(options=...)``: None or {} (what trainers and wrappers pass) are fine; any
    option is an AdapterError, since the protocol's reset carries a seed only."""
    if options:
        raise AdapterError(
            f"{who}.reset(options={options!r}): reset options are not carried to the server "
            "(the protocol's reset carries a seed only), so its envs would ignore them. Set the "
            "envs up where the server makes them: a --gym server takes gymnasium.make() "
            "arguments as `--gym-kwargs JSON` (serve_gym(..., gym_kwargs={...})), and a "
            "factory (`--gym mymodule:MyEnv-v0`, serve_gym(make_env, ...)) can wrap the env "
            "in a gymnasium.Wrapper whose reset() applies the options; then reset with "
            "options=None"
        )


def ndim_of(actions: Any, otherwise: int) -> int:
    """The number of axes of an action argument; ``otherwise`` when it is not numbers of one
    shape (a ragged list: the client's ActionError says so)."""
    ndim = getattr(actions, "ndim", None)  # numpy arrays and scalars: no np.ndim call
    if type(ndim) is int:
        return ndim
    if isinstance(actions, int | float | str | bytes):
        return 0
    try:
        return int(np.ndim(actions))
    except (ValueError, TypeError):
        return otherwise


def one_action_error(action: Any, space: Any, who: str, wanted: str) -> ActionError:
    """The ActionError of an adapter that takes one form of the client's two (docs/client.md
    "Actions"): ``RemoteEnv`` one action, ``RemoteVectorEnv`` one action per env."""
    return ActionError(
        f"{who}.step(): {describe_given(action)} is not an action for {space}: {wanted}"
    )


def observe_infos(client: Client) -> list[dict[str, Any]]:
    """Every env's ``info()`` map (an OBSERVE request: no step, no auto-reset)."""
    _, infos = client.observe()
    return infos


NO_PROGRESS_POLICIES = ("raise", "truncate")
"""What an adapter does with a NoProgressError (decision-boundary runs, the server's watchdog):
raise it (default), or end the stalled env's episode as truncated (the server restarted it)."""


def check_no_progress(policy: str) -> str:
    if policy not in NO_PROGRESS_POLICIES:
        raise ValueError(f"on_no_progress must be 'raise' or 'truncate', not {policy!r}")
    return policy


def stalled_envs(error: NoProgressError) -> list[int]:
    """The envs an ENV_ERROR text names as stalled (``env {i}: ...NoProgressError...``)."""
    return sorted({int(i) for i in _STALLED_ENV.findall(error.text)})


_STALLED_ENV = re.compile(r"(?:^|; )env (\d+): [^;]*NoProgressError")


class ResultFields:
    """The roles of a schema's result struct: which field is the observation, the mask, ..."""

    def __init__(self, client: Client) -> None:
        ir = client.schema[_result_struct(client.schema)].ir
        observation = ir.role("observation")
        reward = ir.role("reward")
        terminated = ir.role("terminated")
        done = ir.role("done")
        if observation is None or reward is None or (terminated is None and done is None):
            raise AdapterError(
                f"the result struct {ir.name} needs fields with the roles observation, reward "
                "and terminated (or done)"
            )
        mask = ir.role("action_mask")
        truncated = ir.role("truncated")
        self.observation = observation.name
        self.observations = ir.roles("observation")  # several: a Dict space (transport.spaces)
        self.obs_dtype = np.dtype(client.schema[ir.name].dtype[observation.name].base)
        self.reward = reward.name
        self.truncated = truncated.name if truncated is not None else None
        # done = terminated or truncated, so terminated = done and not truncated
        self.terminated = terminated.name if terminated is not None else None
        self.done = done.name if done is not None else None
        self.mask = mask.name if mask is not None else None
        roles = {"observation", "action_mask", "reward", "done", "terminated", "truncated"}
        self.info = [
            f.name
            for f in ir.fields
            if f.role not in roles and not f.is_array and f.kind != "struct"
        ]

    def terminated_of(self, view: StepView) -> np.ndarray:
        """Terminated: the ``terminated`` field, else ``done and not truncated``."""
        if self.terminated is not None:
            return np.asarray(view[self.terminated]).astype(bool)
        assert self.done is not None
        ended: np.ndarray = np.asarray(view[self.done]).astype(bool) & ~self.truncated_of(view)
        return ended

    def truncated_of(self, view: StepView) -> np.ndarray:
        if self.truncated is None:
            ended = self.terminated if self.terminated is not None else self.done
            assert ended is not None
            return np.zeros(np.shape(view[ended]), dtype=bool)
        return np.asarray(view[self.truncated]).astype(bool)


def _result_struct(schema: Schema) -> str:
    body = schema.ir.messages["STEP_RESP"].body
    if body is None:
        raise AdapterError(f"schema {schema.name}: STEP_RESP has no body struct")
    return body


def observation_bounds_of(client: Client, bounds: Bounds | None) -> Bounds:
    """``bounds`` if given, else the reference env's known bounds, else (-inf, inf)."""
    if bounds is not None:
        return bounds
    from transport.envs import OBS_BOUNDS

    return OBS_BOUNDS.get(str(client.server_info.get("env", "")), (-np.inf, np.inf))


def _connect(
    url: str | None,
    schema: Schema | str | Path | None,
    timeout: float | None,
    autoreset: str,
    max_body: int,
) -> Client:
    return connect(
        resolve_url(url), schema, timeout=timeout, autoreset=autoreset, max_body=max_body
    )


class RemoteEnv(gymnasium.Env[np.ndarray, np.int64]):
    """One remote env as a ``gymnasium.Env`` (the server must serve one env per connection).

    ``action_masks()`` returns the current action mask (sb3-contrib's MaskablePPO calls it).
    ``reset(seed=s)`` seeds the server's env; ``reset()`` continues its RNG stream.
    """

    metadata: dict[str, Any] = {"render_modes": RENDER_MODES}

    def __init__(
        self,
        url: str | None = None,
        *,
        schema: Schema | str | Path | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        observation_bounds: Bounds | None = None,
        render_mode: str | None = None,
        on_no_progress: str = "raise",
        max_body: int | None = None,
    ) -> None:
        """``render_mode="rgb_array"``: ``render()`` returns the env's frame (``FRAME_HELP``).
        ``on_no_progress="truncate"``: a stalled env (NoProgressError) ends its episode as
        truncated instead of raising (docs/adapters.md "Decision-boundary runs").
        ``max_body``: the largest reply accepted (``connect``'s; ``max_body_for``)."""
        self.render_mode = check_render_mode(render_mode)
        self.on_no_progress = check_no_progress(on_no_progress)
        self.client = _connect(
            url, schema, timeout, "disabled", max_body_for(max_body, self.render_mode)
        )
        try:
            check_single_env(self.client)
            self.fields = ResultFields(self.client)
            space = self.client.spaces()
            bounds = observation_bounds_of(self.client, observation_bounds)
            self.observation_space = observation_space_of(self.client.schema, bounds)
            self.action_space = action_space_of(self.client.schema, space.act_n)
            self._action = action_field_of(self.client.schema)
        except BaseException:
            self.client.close()
            raise
        self._mask = np.ones(space.act_n, dtype=bool)
        self._action_ndim = len(self.action_space.shape or ())  # one action's; a batch has more

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        check_no_options(options, "RemoteEnv")
        super().reset(seed=seed)
        view = self.client.reset(seed)
        return self._observe(view), self._info(view)

    def step(
        self, action: np.int64 | int
    ) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        if type(action) is not int and ndim_of(action, 0) > self._action_ndim:
            one = self.action_space.shape
            form = "an int" if one == () else f"an array of shape {one}"
            raise one_action_error(
                action,
                self.action_space,
                "RemoteEnv",
                f"RemoteEnv plays one env: pass one action ({form}), not a batch "
                "(transport.gym.RemoteVectorEnv takes one action per env)",
            )
        try:
            view = step_explained(self.client, actions_of(action, self._action))
        except NoProgressError as exc:
            if self.on_no_progress == "raise":
                raise
            # the server restarted the env: its first observation, the episode truncated
            view, _ = self.client.observe()
            info = {**self._info(view), "no_progress": str(exc), "last_state": exc.last_state}
            return self._observe(view), 0.0, False, True, info
        fields = self.fields
        return (
            self._observe(view),
            float(view[fields.reward]),
            bool(fields.terminated_of(view)),
            bool(fields.truncated_of(view)),
            self._info(view),
        )

    def action_masks(self) -> np.ndarray:
        """The legal actions of the current state (bool, length act_n)."""
        return self._mask.copy()

    def render(self) -> np.ndarray | None:
        """The env's current rgb_array frame (``render_mode="rgb_array"``), else None."""
        if self.render_mode is None:
            return None
        return frame_of(observe_infos(self.client)[0], self.client.url, self.client.schema)

    def close(self) -> None:
        self.client.close()
        super().close()

    def _observe(self, view: StepView) -> np.ndarray:
        if self.fields.mask is not None:
            mask = view[self.fields.mask]
            self._mask[:] = False
            n = min(len(mask), len(self._mask))
            self._mask[:n] = mask[:n]
        return observation_of(view, self.fields.observations)  # type: ignore[return-value]

    def _info(self, view: StepView) -> dict[str, Any]:
        return {name: view[name].item() for name in self.fields.info}


def autoreset_mode_of(value: AutoresetMode | str) -> AutoresetMode:
    """An ``AutoresetMode`` from itself, its value (``"NextStep"``) or the wire name
    (``"next_step"``, the name the protocol and ``transport.connect`` use)."""
    if isinstance(value, AutoresetMode):
        return value
    key = str(value).replace("-", "_").replace(" ", "_").lower()
    for mode in AutoresetMode:
        if key in (mode.name.lower(), mode.value.lower()):
            return mode
    names = ", ".join(mode.name.lower() for mode in AutoresetMode)
    raise AdapterError(f"unknown auto-reset mode {value!r}: expected one of {names}")


class RemoteVectorEnv(VectorEnv[np.ndarray, np.ndarray, np.ndarray]):
    """N remote envs over one connection as a ``gymnasium.vector.VectorEnv``.

    One batched message per step. Auto-reset happens on the server (docs/protocol.md):
    ``autoreset_mode=AutoresetMode.NEXT_STEP`` (default: the step after an episode ended
    ignores that env's action and returns its reset observation, reward 0, not terminated) or
    ``AutoresetMode.SAME_STEP`` (the step that ends an episode returns the reset observation,
    the final reward/terminated/truncated, and, as gymnasium's own vector envs do,
    ``infos["final_obs"]``: an object array of N entries, the final observation of each env
    whose episode ended and None elsewhere, plus ``infos["final_info"]`` (a dict of info
    arrays), each with its ``_final_obs`` / ``_final_info`` mask; the keys are present only on
    steps where an episode ended). Infos always hold every info scalar of the schema as an
    (N,) array with an all-True ``_name`` mask: same keys, dtypes and shapes on every step.
    """

    def __init__(
        self,
        url: str | None = None,
        num_envs: int | None = None,
        *,
        schema: Schema | str | Path | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        observation_bounds: Bounds | None = None,
        client: Client | None = None,
        render_mode: str | None = None,
        on_no_progress: str = "raise",
        max_body: int | None = None,
    ) -> None:
        """``client``: drive this connected client (its auto-reset mode must be the one asked
        for) instead of connecting to ``url``; the adapter closes it. ``render_mode``:
        "rgb_array" makes ``render()`` return each env's frame (``FRAME_HELP``).
        ``on_no_progress="truncate"``: a stalled env (NoProgressError) ends its episode as
        truncated instead of raising (docs/adapters.md "Decision-boundary runs").
        ``max_body``: the largest reply accepted (``connect``'s): by default 64 MiB, and
        ``RENDER_MAX_BODY`` with a render mode, since one reply holds every env's frame."""
        self.render_mode = check_render_mode(render_mode)
        self.on_no_progress = check_no_progress(on_no_progress)
        mode = autoreset_mode_of(autoreset_mode)
        if mode == AutoresetMode.DISABLED:
            raise AdapterError(
                "RemoteVectorEnv needs server-side auto-reset: use AutoresetMode.NEXT_STEP or "
                "SAME_STEP (or the Client for manual resets)"
            )
        wire = "next_step" if mode == AutoresetMode.NEXT_STEP else "same_step"
        if client is not None:
            if max_body is not None:
                raise AdapterError(
                    "RemoteVectorEnv(client=..., max_body=...): max_body is the limit of the "
                    "connection the adapter opens; connect the client with it instead "
                    "(transport.connect(url, max_body=...))"
                )
            check_autoreset(client, wire)  # before the adapter owns (and would close) it
        if client is None:
            limit = max_body_for(max_body, self.render_mode)
            self.client = _connect(url, schema, timeout, wire, limit)
        else:
            self.client = client
        try:
            self.num_envs = check_num_envs(self.client, resolve_num_envs(num_envs))
            self.fields = ResultFields(self.client)
            space = self.client.spaces()
            bounds = observation_bounds_of(self.client, observation_bounds)
        except BaseException:
            self.client.close()
            raise
        self.metadata = {"autoreset_mode": mode, "render_modes": RENDER_MODES}
        self.autoreset_mode = mode
        self.single_observation_space = observation_space_of(self.client.schema, bounds)
        self.single_action_space = action_space_of(self.client.schema, space.act_n)
        self._action = action_field_of(self.client.schema)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._masks = np.ones((self.num_envs, space.act_n), dtype=bool)
        # one env: the client would also take one action (shape S) and answer without an env
        # axis; a vector env takes (1, *S) only
        self._one_action_ndim = (
            len(self.single_action_space.shape or ()) if self.num_envs == 1 else -1
        )

    def reset(
        self,
        *,
        seed: int | list[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env; ``seed=s`` gives env i the seed s + i, a list ``[s0, s1, ...]`` (one
        int or None per env, as ``SyncVectorEnv``) gives env i ``seeds[i]`` (RESET_SEEDS).
        ``options``: None or {} only (AdapterError: the server's envs would not get them)."""
        check_no_options(options, type(self).__name__)
        if isinstance(seed, list | tuple):
            if len(seed) != self.num_envs:
                raise AdapterError(
                    f"reset(seed=[...]) needs one seed (or None) per env: {self.num_envs}, "
                    f"got {len(seed)}"
                )
            view = self.client.reset(None if all(s is None for s in seed) else list(seed))
            return self._observe(view), self._infos(view)
        if seed is not None:
            self._np_random, self._np_random_seed = gymnasium.utils.seeding.np_random(seed)
        view = self.client.reset(seed)
        return self._observe(view), self._infos(view)

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if self._one_action_ndim >= 0 and ndim_of(actions, 99) <= self._one_action_ndim:
            raise one_action_error(
                actions,
                self.action_space,
                type(self).__name__,
                f"pass one action per env: an array of shape {self.action_space.shape}",
            )
        try:
            view = step_explained(self.client, actions_of(actions, self._action, self.num_envs))
        except NoProgressError as exc:
            if self.on_no_progress == "raise":
                raise
            return self._truncate_stalled(exc)
        fields = self.fields
        rewards = np.array(view[fields.reward], dtype=np.float64)
        terminated = fields.terminated_of(view)
        truncated = fields.truncated_of(view)
        infos = self._infos(view)
        if self.autoreset_mode == AutoresetMode.SAME_STEP and self.client.finals:
            self._add_finals(rewards, terminated, truncated, infos)
        return self._observe(view), rewards, terminated, truncated, infos

    def action_masks(self) -> np.ndarray:
        """(N, act_n) bool: the legal actions of each env's current state."""
        return self._masks.copy()

    def render(self) -> tuple[np.ndarray, ...] | None:
        """Each env's current rgb_array frame (``render_mode="rgb_array"``), else None."""
        if self.render_mode is None:
            return None
        url = self.client.url
        return tuple(
            frame_of(info, f"{url} env {i}", self.client.schema)
            for i, info in enumerate(observe_infos(self.client))
        )

    # -- what gymnasium's wrappers ask of a vector env (SyncVectorEnv's call/get_attr/set_attr)

    def _attributes(self) -> dict[str, Any]:
        """The attributes of each env that the adapter knows without asking the server."""
        return {
            "render_mode": self.render_mode,
            "spec": None,
            "metadata": {"render_modes": RENDER_MODES},
            "observation_space": self.single_observation_space,
            "action_space": self.single_action_space,
        }

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of each env (a tuple, as ``SyncVectorEnv``): the attributes
        gymnasium's wrappers read (``render_mode``, ``spec``, ``metadata``, the single spaces);
        the envs' own attributes live in the server process and are an AdapterError."""
        known = self._attributes()
        if name not in known:
            raise AdapterError(
                f"RemoteVectorEnv cannot read attribute {name!r} of the envs at "
                f"{self.client.url}: they live in the server process; readable here: "
                f"{', '.join(sorted(known))} (call: render, action_masks)"
            )
        return tuple(known[name] for _ in range(self.num_envs))

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Always an AdapterError: the envs live in the server process (set them up where the
        server makes them)."""
        raise AdapterError(
            f"RemoteVectorEnv cannot set attribute {name!r} of the envs at {self.client.url}: "
            "they live in the server process; configure them in the env factory the server runs"
        )

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``render`` (each env's frame) and ``action_masks`` (each env's mask) as a tuple per
        env, as ``SyncVectorEnv.call``; the attributes of ``get_attr``; else AdapterError."""
        if name == "render":
            frames = self.render()
            return frames if frames is not None else (None,) * self.num_envs
        if name == "action_masks":
            return tuple(self.action_masks())
        if name in self._attributes():
            return self.get_attr(name)
        raise AdapterError(
            f"RemoteVectorEnv cannot call {name!r} on the envs at {self.client.url}: they live "
            "in the server process; callable here: render, action_masks (and the attributes "
            "of get_attr)"
        )

    def close_extras(self, **kwargs: Any) -> None:
        self.client.close()

    # -- internals -----------------------------------------------------------------------------

    def _truncate_stalled(
        self, error: NoProgressError
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """``on_no_progress="truncate"``: every env's current result (one OBSERVE); each stalled
        env (restarted by the server) shows its first observation, reward 0, truncated, and
        ``infos["no_progress"]`` (the error text, "" elsewhere)."""
        stalled = stalled_envs(error)
        if not stalled or "could not be reset" in error.text:
            raise error
        view, _ = self.client.observe()
        fields = self.fields
        n = self.num_envs
        rewards = np.array(view[fields.reward], dtype=np.float64).reshape(n)
        terminated = np.asarray(fields.terminated_of(view)).reshape(n).copy()
        truncated = np.asarray(fields.truncated_of(view)).reshape(n).copy()
        infos = self._infos(view)
        infos["no_progress"] = np.array([""] * n, dtype=object)
        infos["_no_progress"] = np.zeros(n, dtype=bool)
        for i in stalled:
            rewards[i], terminated[i], truncated[i] = 0.0, False, True
            infos["no_progress"][i] = error.text
            infos["_no_progress"][i] = True
        return self._observe(view), rewards, terminated, truncated, infos

    def _observe(self, view: StepView) -> np.ndarray:
        if self.fields.mask is not None:
            mask = view[self.fields.mask]
            n = min(mask.shape[-1], self._masks.shape[1])
            self._masks[:] = False
            self._masks[:, :n] = mask.reshape(self.num_envs, -1)[:, :n]
        return observation_of(view, self.fields.observations, self.num_envs)  # type: ignore[return-value]

    def _infos(self, view: StepView) -> dict[str, Any]:
        infos: dict[str, Any] = {}
        for name in self.fields.info:
            infos[name] = np.array(view[name], copy=True).reshape(self.num_envs)
            infos["_" + name] = np.ones(self.num_envs, dtype=bool)
        return infos

    def _add_finals(
        self,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        infos: dict[str, Any],
    ) -> None:
        fields = self.fields
        ended = np.zeros(self.num_envs, dtype=bool)
        final_obs = np.full(self.num_envs, None, dtype=object)  # gymnasium's format
        final_info: dict[str, Any] = {}
        for name in fields.info:
            final_info[name] = np.zeros_like(infos[name])
        for index, final in self.client.finals:
            ended[index] = True
            rewards[index] = float(final[fields.reward])
            terminated[index] = bool(fields.terminated_of(final))
            truncated[index] = bool(fields.truncated_of(final))
            final_obs[index] = observation_of(final, fields.observations)
            for name in fields.info:
                final_info[name][index] = final[name]
        for name in fields.info:
            final_info["_" + name] = ended.copy()
        infos["final_obs"], infos["_final_obs"] = final_obs, ended
        infos["final_info"], infos["_final_info"] = final_info, ended.copy()


class RemoteAsyncVectorEnv(RemoteVectorEnv):
    """``RemoteVectorEnv`` plus EnvPool's asynchronous API (docs/client.md, "Asynchronous
    batches"): ``async_reset()``, ``send(actions, env_ids)`` and ``recv()``, which returns the
    first ``batch_size`` envs to finish with ``infos["env_id"]``. ``reset`` / ``step`` stay
    lock-step (refused with ASYNC_STATE while envs are in flight)."""

    def __init__(
        self,
        url: str | None = None,
        num_envs: int | None = None,
        *,
        batch_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(url, num_envs, **kwargs)
        self.batch_size = batch_size or self.num_envs
        self.client.batch_size = self.batch_size

    def async_reset(self, seed: int | None = None) -> None:
        """Reset every env (env i: ``seed + i``); ``recv`` returns them."""
        self.client.async_reset(seed)

    def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
        """Step env ``env_ids[k]`` with ``actions[k]``, without waiting."""
        ids = np.asarray(env_ids)
        self.client.send(actions_of(actions, self._action, len(ids)), ids)

    def recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """(obs, rewards, terminated, truncated, infos) of the first ``batch_size`` envs to
        finish, rows in ``infos["env_id"]`` order; SAME_STEP adds ``infos["final_obs"]``."""
        got = self.client.recv(self.batch_size)
        view, ids = got.results, got.env_ids
        fields = self.fields
        count = len(ids)
        rewards = np.array(view[fields.reward], dtype=np.float64).reshape(count)
        terminated = fields.terminated_of(view).reshape(count)
        truncated = fields.truncated_of(view).reshape(count)
        infos: dict[str, Any] = {"env_id": ids.copy()}
        for name in fields.info:
            infos[name] = np.array(view[name], copy=True).reshape(count)
        if got.finals:
            final_obs = np.full(count, None, dtype=object)
            row = {int(i): k for k, i in enumerate(ids.tolist())}
            for index, final in got.finals:
                k = row[index]
                rewards[k] = float(final[fields.reward])
                terminated[k] = bool(fields.terminated_of(final))
                truncated[k] = bool(fields.truncated_of(final))
                final_obs[k] = observation_of(final, fields.observations)
            infos["final_obs"] = final_obs
        obs = observation_of(view, fields.observations, count)
        return obs, rewards, terminated, truncated, infos  # type: ignore[return-value]
