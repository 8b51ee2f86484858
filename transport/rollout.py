"""Batched rollout collector (seed 000, 4.1c): ``obs -> policy(obs, masks) -> actions -> step``.

``RolloutCollector(client, policy, steps)`` drives the N envs of a ``transport.torch.TorchClient``
(connected with ``autoreset="same_step"``) for ``steps`` lock steps per ``collect()`` and writes
into a preallocated ``RolloutBuffer`` of torch tensors ``[T, N, ...]`` on the client's device.
Observations and masks stay on that device: they reach it through the client's staging path
(one block copy per step on CUDA, views on the CPU), are copied once into the buffer (the
client reuses its tensors), and the policy reads them there. Actions go back to the host once
per step (the client's pinned buffer).

Auto-reset is the server's (same_step, SB3's contract): the step that ends an episode returns
the reset observation; the collector takes that step's reward and terminated/truncated flags
from ``client.finals`` (the final result) and keeps each final result in ``buffer.finals`` as
``(t, env, TensorStep)`` so a trainer can bootstrap truncated episodes from the final
observation. Torch is imported here: this module is the torch extra's, never the core's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch

from transport.errors import AdapterError
from transport.torch import TensorStep, TorchClient, torch_dtype

_cuda: Any = torch.cuda  # torch's CUDA calls are untyped: called through Any

Policy = Callable[[Any, Any], Any]
"""``policy(observations [N, *obs] (a dict of them by field name for several observation
fields), masks [N, A] bool or None) -> actions [N, *act]`` or
``(actions, extras)`` where ``extras`` maps names to ``[N, ...]`` tensors (log-probabilities,
values) that the buffer keeps as ``extras[name][t]``. Called under ``torch.no_grad()``."""


@dataclass
class RolloutBuffer:
    """One rollout: step t of env i is ``observations[t, i]`` seen (with ``masks[t, i]``; a
    schema with several observation fields, a gymnasium Dict space, has a dict of them),
    ``actions[t, i]`` taken, ``rewards[t, i]`` received, and ``terminated`` / ``truncated``
    the episode's end at that step (``dones`` either). ``next_observations`` / ``next_masks``:
    after the last step (the bootstrap state). ``finals``: ``(t, i, TensorStep)`` the final
    result of each episode that ended at step t (its observation is the one after the end)."""

    observations: Any
    masks: Any
    actions: Any
    rewards: Any
    terminated: Any
    truncated: Any
    dones: Any
    next_observations: Any
    next_masks: Any
    extras: dict[str, Any] = field(default_factory=dict)
    finals: list[tuple[int, int, TensorStep]] = field(default_factory=list)
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return int(self.rewards.shape[0])


class RolloutCollector:
    """Collect ``steps`` lock steps of every env into a reused ``RolloutBuffer``.

    ``seed``: the first reset's seed (env i gets seed + i). The buffer is allocated once and
    overwritten by each ``collect()``: copy what must outlive the next one. ``cuda_graph``
    (CUDA clients): the policy is captured once as a CUDA graph over the client's device
    tensors and replayed each step (one launch instead of one per kernel: on a GPU the policy's
    launches, not its math, are most of a step); the policy must be capturable (no host sync,
    fixed shapes)."""

    def __init__(
        self,
        client: TorchClient,
        policy: Policy,
        steps: int,
        *,
        seed: int | None = None,
        cuda_graph: bool = False,
    ) -> None:
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        if cuda_graph and client.device.type != "cuda":
            raise AdapterError(
                f"cuda_graph=True needs a CUDA client (this one: device={client.device}, "
                f"{client.device_reason})"
            )
        mode = client.client.channel.info.get("autoreset")
        if mode != "same_step":
            raise AdapterError(
                f"the rollout collector needs a client connected with autoreset='same_step' "
                f"(this one: {mode!r}): transport.torch.connect(url, autoreset='same_step')"
            )
        schema = client.schema
        body = schema.ir.messages["STEP_RESP"].body
        if body is None:
            raise AdapterError(f"schema {schema.name}: STEP_RESP has no body struct")
        ir = schema[body].ir
        observations = ir.roles("observation")
        reward = ir.role("reward")
        terminated = ir.role("terminated") or ir.role("done")
        if not observations or reward is None or terminated is None:
            raise AdapterError(
                f"the result struct {ir.name} needs fields with the roles observation, reward "
                "and terminated (or done)"
            )
        self.client = client
        self.policy = policy
        self.seed = seed
        # several observation fields (a gymnasium Dict space): dicts of tensors by field name
        self.obs_names = [f.name for f in observations]
        self.dict_obs = len(self.obs_names) > 1
        mask = ir.role("action_mask")
        truncated = ir.role("truncated")
        self.mask_name = mask.name if mask is not None else None
        self.reward_name = reward.name
        self.truncated_name = truncated.name if truncated is not None else None
        # a "done" field means terminated or truncated: terminated = done and not truncated
        self.ended_name = terminated.name
        self.ended_is_done = terminated.role == "done"
        self._last: TensorStep | None = None
        self.cuda_graph = cuda_graph
        self._graphs: dict[tuple[int, ...], _PolicyGraph] = {}
        self._graph_inputs = [*self.obs_names, *([self.mask_name] if self.mask_name else [])]
        self._returns = np.zeros(client.num_envs, dtype=np.float64)
        self._lengths = np.zeros(client.num_envs, dtype=np.int64)
        self.total_steps = 0
        self.buffer = self._allocate(steps)
        # rewards and end flags are gathered on the host from the client's NumPy view (a few
        # bytes per env: no kernel per step), then copied to the device once per collect
        buf = self.buffer
        on_device = client.device.type != "cpu"

        def host_of(tensor: Any) -> Any:
            if not on_device:
                return tensor  # the buffer itself: its NumPy view is written in place
            return torch.empty(tuple(tensor.shape), dtype=tensor.dtype, pin_memory=True)

        self._host = [host_of(t) for t in (buf.rewards, buf.terminated, buf.truncated, buf.dones)]
        self._rewards, self._terminated, self._truncated, self._dones = (
            t.numpy() for t in self._host
        )
        self._uploaded: Any = _cuda.Event() if on_device else None
        self._finals_stage: _FinalsStage | None = None  # pinned (CUDA clients)
        self._finals_copied: Any = None
        self._uploading = False

    def _allocate(self, steps: int) -> RolloutBuffer:
        dtype = self.client.schema[self.client.schema.ir.messages["STEP_RESP"].body or ""].dtype
        n, device = self.client.num_envs, self.client.device

        def zeros(shape: tuple[int, ...], kind: Any) -> Any:
            return torch.zeros(shape, dtype=kind, device=device)

        def observations(rows: tuple[int, ...]) -> Any:
            out = {}
            for name in self.obs_names:
                kind = torch_dtype(dtype[name].base)
                if kind is None:
                    raise AdapterError(f"observation field {name} has no torch dtype")
                out[name] = zeros((*rows, *dtype[name].shape), kind)
            return out if self.dict_obs else out[self.obs_names[0]]

        masks = next_masks = None
        if self.mask_name is not None:
            width = tuple(dtype[self.mask_name].shape)
            masks, next_masks = (
                zeros((steps, n, *width), torch.bool),
                zeros((n, *width), torch.bool),
            )
        flags = (steps, n)
        return RolloutBuffer(
            observations=observations((steps, n)),
            masks=masks,
            actions=None,  # allocated at the first step, from the policy's actions
            rewards=zeros(flags, torch.float32),
            terminated=zeros(flags, torch.bool),
            truncated=zeros(flags, torch.bool),
            dones=zeros(flags, torch.bool),
            next_observations=observations((n,)),
            next_masks=next_masks,
        )

    def reset(self) -> TensorStep:
        """Reset every env (the collector's seed); the next ``collect`` starts from there."""
        self._last = self.client.reset(self.seed)
        self._returns[:] = 0
        self._lengths[:] = 0
        return self._last

    def collect(self) -> RolloutBuffer:
        """``steps`` lock steps of every env into ``self.buffer`` (returned)."""
        last = self._last if self._last is not None else self.reset()
        buf = self.buffer
        buf.finals = []
        if self._uploading:  # the last collect's flags may still be read from the host arrays
            self._uploaded.synchronize()
            self._uploading = False
        for t in range(buf.steps):
            obs = self._observe(buf.observations, t, last)
            mask = None
            if buf.masks is not None and self.mask_name is not None:
                mask = buf.masks[t]
                mask.copy_(last[self.mask_name], non_blocking=True)  # u8 -> bool on the device
            if self.cuda_graph:
                out = self._graph_for(last).replay()
            else:
                with torch.no_grad():
                    out = self.policy(obs, mask)
            actions, extras = out if isinstance(out, tuple) else (out, {})
            self._keep(buf, t, actions, extras)
            last = self.client.step(actions)
            self._ends(buf, t)
        self._last = last
        self._observe(buf.next_observations, None, last)
        if buf.next_masks is not None and self.mask_name is not None:
            buf.next_masks.copy_(last[self.mask_name])
        if self._uploaded is not None:
            kept = (buf.rewards, buf.terminated, buf.truncated, buf.dones)
            for device_side, host_side in zip(kept, self._host, strict=True):
                device_side.copy_(host_side, non_blocking=True)
            self._uploaded.record(_cuda.current_stream(self.client.device))
            self._uploading = True
        self._episodes(buf)
        self.total_steps += buf.steps * self.client.num_envs
        return buf

    def _graph_for(self, last: TensorStep) -> _PolicyGraph:
        """The policy captured for the client's device tensors that ``last`` holds: one graph
        per staging block (the client keeps one per result view: a reset's and a step's may
        differ), captured the first time it is seen."""
        key = tuple(int(last[name].data_ptr()) for name in self._graph_inputs)
        graph = self._graphs.get(key)
        if graph is None:
            if len(self._graphs) >= 4:  # the client replaced its buffers: drop the old graphs
                self._graphs.clear()
            graph = _PolicyGraph(self.policy, last, self.obs_names, self.mask_name)
            self._graphs[key] = graph
        return graph

    def _observe(self, into: Any, t: int | None, result: TensorStep) -> Any:
        """Copy ``result``'s observation field(s) into ``into`` (row ``t``); the row(s)."""
        rows = {}
        for name in self.obs_names:
            kept = into[name] if self.dict_obs else into
            row = kept if t is None else kept[t]
            row.copy_(result[name], non_blocking=True)
            rows[name] = row
        return rows if self.dict_obs else rows[self.obs_names[0]]

    def _keep(self, buf: RolloutBuffer, t: int, actions: Any, extras: dict[str, Any]) -> None:
        if buf.actions is None:
            shape = (buf.steps, *actions.shape)
            buf.actions = torch.zeros(shape, dtype=actions.dtype, device=self.client.device)
        buf.actions[t].copy_(actions)
        for name, value in extras.items():
            kept = buf.extras.get(name)
            if kept is None:
                shape = (buf.steps, *value.shape)
                kept = buf.extras[name] = torch.zeros(
                    shape, dtype=value.dtype, device=self.client.device
                )
            kept[t].copy_(value)

    def _ends(self, buf: RolloutBuffer, t: int) -> None:
        """Step t's reward and end flags, on the host from the client's NumPy view; an ended
        episode's come from its final result, which ``buf.finals`` keeps as tensors."""
        view = self.client.view
        assert view is not None
        self._rewards[t] = view[self.reward_name]
        self._flags(t, view, slice(None))
        finals = self.client.client.finals
        if not finals:
            return
        # the ended envs' final records, stacked once: every field below is one array operation
        at = np.array([index for index, _ in finals], dtype=np.intp)
        first = finals[0][1].record
        records = np.array([final.record for _, final in finals], dtype=first.dtype)
        self._rewards[t, at] = records[self.reward_name]
        self._flags(t, records, at)
        for index, step in self._final_tensors(at.tolist(), records):
            buf.finals.append((t, index, step))

    def _flags(self, t: int, result: Any, at: Any) -> None:
        ended = np.asarray(result[self.ended_name]) != 0
        truncated = (
            np.asarray(result[self.truncated_name]) != 0
            if self.truncated_name is not None
            else np.zeros_like(ended)
        )
        terminated = ended & ~truncated if self.ended_is_done else ended
        self._terminated[t, at] = terminated
        self._truncated[t, at] = truncated
        self._dones[t, at] = terminated | truncated

    def _final_tensors(
        self, indices: list[int], records: np.ndarray
    ) -> list[tuple[int, TensorStep]]:
        """The step's final results (``records``, of envs ``indices``) as owned tensors on the
        device: field by field into a reused pinned stage (a 64-byte aligned section per field)
        and in ONE asynchronous copy into a fresh device block, each field a view of it (the
        finals of earlier steps stay intact); each final's ``TensorStep`` indexes its row only
        when read."""
        if self.client.device.type == "cpu":
            names = records.dtype.names or ()
            stacked = _Stacked(
                {
                    # owned, standard strides
                    name: partial(lambda n: torch.from_numpy(records[n].copy()), name)
                    for name in names
                    if torch_dtype(records[name].dtype) is not None
                }
            )
        else:
            stacked = self._stage_finals(records)
        return [(index, TensorStep(_FinalRow(stacked, k))) for k, index in enumerate(indices)]

    def _stage_finals(self, records: np.ndarray) -> _Stacked:
        """The final records' fields stacked on the device (views of one block, one copy;
        each view made when first read)."""
        device, count = self.client.device, len(records)
        if self._finals_copied is not None:
            self._finals_copied.synchronize()  # the last step's copy has read the stage
        stage = self._finals_stage
        if stage is None:
            stage = self._finals_stage = _FinalsStage(records.dtype, self.client.num_envs)
        places, nbytes = stage.places(count)
        for name, rows in stage.rows(places, count).items():
            rows[...] = records[name]
        block = torch.empty(nbytes, dtype=torch.uint8, device=device)
        block.copy_(stage.host[:nbytes], non_blocking=True)
        if self._finals_copied is None:
            self._finals_copied = _cuda.Event()
        self._finals_copied.record(_cuda.current_stream(device))
        return _Stacked(
            {
                name: partial(_field_view, block, at, count, width, tdtype, shape)
                for name, (at, width, tdtype, shape) in zip(stage.fields, places, strict=True)
            }
        )

    def _episodes(self, buf: RolloutBuffer) -> None:
        """The returns and lengths of the episodes that ended in this rollout (from the host
        arrays: no device sync)."""
        rewards = self._rewards.astype(np.float64)
        dones = self._dones
        buf.episode_returns = []
        buf.episode_lengths = []
        for t in range(buf.steps):
            self._returns += rewards[t]
            self._lengths += 1
            for i in np.flatnonzero(dones[t]).tolist():
                buf.episode_returns.append(float(self._returns[i]))
                buf.episode_lengths.append(int(self._lengths[i]))
                self._returns[i] = 0.0
                self._lengths[i] = 0


class _PolicyGraph:
    """The policy captured as a CUDA graph (``cuda_graph=True``): its inputs are the client's
    device tensors (views of its staging block, at fixed addresses while its plan stays), the
    mask converted to bool inside the graph; each step is one replay instead of the policy's
    kernel launches one by one. The policy must be capturable: no host syncs (no ``.item()``,
    no ``torch.distributions`` argument validation), fixed shapes."""

    def __init__(
        self, policy: Policy, last: TensorStep, obs_names: list[str], mask_name: str | None
    ) -> None:
        self.obs_names = obs_names
        self.mask_name = mask_name
        self.inputs = {name: last[name] for name in obs_names}
        if mask_name is not None:
            self.inputs[mask_name] = last[mask_name]

        def run() -> Any:
            obs = {name: self.inputs[name] for name in obs_names}
            mask = self.inputs[mask_name] != 0 if mask_name is not None else None
            return policy(obs if len(obs_names) > 1 else obs[obs_names[0]], mask)

        device = next(iter(self.inputs.values())).device
        side = _cuda.Stream(device)
        side.wait_stream(_cuda.current_stream(device))
        with torch.no_grad(), _cuda.stream(side):
            for _ in range(3):  # warm-up before capture (allocator, lazy init, autotuning)
                run()
        _cuda.current_stream(device).wait_stream(side)
        self.graph = _cuda.CUDAGraph()
        with torch.no_grad(), _cuda.graph(self.graph):
            self.out = run()

    def replay(self) -> Any:
        self.graph.replay()
        return self.out


def _field_view(
    block: Any, at: int, count: int, width: int, tdtype: Any, shape: tuple[int, ...]
) -> Any:
    """``count`` rows of one field: a view of the device block's section at ``at``."""
    return block[at : at + count * width].view(tdtype).reshape(count, *shape)


class _Stacked(Mapping[str, Any]):
    """A step's final results, field by field as (count, ...) tensors, each made when first
    read (most finals are never read: ~2 torch calls per field a step saved)."""

    __slots__ = ("_made", "_makers")

    def __init__(self, makers: dict[str, Callable[[], Any]]) -> None:
        self._makers = makers
        self._made: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        made = self._made.get(name)
        if made is None:
            made = self._made[name] = self._makers[name]()
        return made

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


class _FinalRow(Mapping[str, Any]):
    """Row ``k`` of a step's stacked final results, field by field, indexed when read."""

    __slots__ = ("_k", "_stacked")

    def __init__(self, stacked: Mapping[str, Any], k: int) -> None:
        self._stacked, self._k = stacked, k

    def __getitem__(self, name: str) -> Any:
        return self._stacked[name][self._k]

    def __iter__(self) -> Iterator[str]:
        return iter(self._stacked)

    def __len__(self) -> int:
        return len(self._stacked)


class _FinalsStage:
    """A pinned host buffer for a step's final results (up to ``num_envs``): for ``count``
    finals, each field (of a torch dtype) has a section of ``count`` rows at a multiple of 64
    bytes, back to back, so the step's finals travel in one copy of exactly their bytes."""

    def __init__(self, dtype: np.dtype[Any], num_envs: int) -> None:
        self.fields: dict[str, tuple[int, Any, Any, tuple[int, ...]]] = {}
        """name: (bytes per row, NumPy dtype, torch dtype, shape)."""
        for name in dtype.names or ():
            base, shape = dtype[name].base, dtype[name].shape
            tdtype = torch_dtype(base)
            if tdtype is not None:
                self.fields[name] = (dtype[name].itemsize, base, tdtype, shape)
        _, most = self.places(num_envs)
        pinned = torch.cuda.is_available()  # pinned for the device's asynchronous copy
        self.host = torch.empty(max(most, 1), dtype=torch.uint8, pin_memory=pinned)
        self._whole = self.host.numpy()

    def places(self, count: int) -> tuple[list[tuple[int, int, Any, tuple[int, ...]]], int]:
        """Per field ``(offset, bytes per row, torch dtype, shape)`` for ``count`` rows, and
        the bytes of all the sections."""
        at, out = 0, []
        for width, _, tdtype, shape in self.fields.values():
            out.append((at, width, tdtype, shape))
            at += -(-(width * count) // 64) * 64
        return out, at

    def rows(
        self, places: list[tuple[int, int, Any, tuple[int, ...]]], count: int
    ) -> dict[str, np.ndarray]:
        """The sections of ``places`` as ``count`` NumPy rows each (views of the buffer)."""
        return {
            name: self._whole[at : at + width * count].view(dtype).reshape(count, *shape)
            for (name, (_, dtype, _, shape)), (at, width, _, _) in zip(
                self.fields.items(), places, strict=True
            )
        }
