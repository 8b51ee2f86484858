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
from typing import Any

import numpy as np
import torch

from transport.errors import ActionError, AdapterError
from transport.torch import TensorStep, TorchClient, _address, _record_fields, torch_dtype

_cuda: Any = torch.cuda  # torch's CUDA calls are untyped: called through Any

_ACTIONS = object()
"""The key of the actions' rows among the extras' (no extra's name)."""

Policy = Callable[[Any, Any], Any]
"""``policy(observations [N, *obs] (a dict of them by field name for several observation
fields), masks [N, A] bool or None) -> actions [N, *act]`` or
``(actions, extras)`` where ``extras`` maps names to ``[N, ...]`` tensors (log-probabilities,
values) that the buffer keeps as ``extras[name][t]``. Called under ``torch.no_grad()``.
Actions and extras may also be NumPy arrays, lists or numbers (what ``TorchClient.step``
takes): they are made tensors with ``torch.as_tensor`` (an array's memory shared, on the
host), so the buffer keeps them with their dtype and shape."""


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
        self._graph_last: tuple[TensorStep, _PolicyGraph] | None = None  # the last one used
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
        # step t's host rows and buffer rows, made once: a step indexes nothing
        self._host_rows = list(
            zip(self._rewards, self._terminated, self._truncated, self._dones, strict=True)
        )
        self._rows_of_buffer: RolloutBuffer | None = None  # the buffer the rows below are of
        self._obs_rows: list[list[tuple[str, Any]]] = []
        self._mask_rows: list[Any] = []
        self._kept_rows: dict[Any, list[Any]] = {}  # [whole, *rows] of actions and extras
        self._uploaded: Any = _cuda.Event() if on_device else None
        self._staged = on_device  # finals through the pinned stage, to a device block
        self._finals_stage: _FinalsStage | None = None  # pinned (CUDA clients)
        self._final_fields: _FinalFields | None = None
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
        if self._rows_of_buffer is not buf:  # made once (again if the buffer was replaced)
            self._obs_rows = [self._rows_of(buf.observations, t) for t in range(buf.steps)]
            self._mask_rows = [
                None if buf.masks is None else buf.masks[t] for t in range(buf.steps)
            ]
            self._rows_of_buffer = buf
        step, mask_name = self.client.step, self.mask_name or ""
        with torch.no_grad():  # the policy's, and the buffer's copies need no graph either
            for t in range(buf.steps):
                obs = self._observe(self._obs_rows[t], last)
                mask = self._mask_rows[t]
                if mask is not None:
                    mask.copy_(last[mask_name], non_blocking=True)  # u8 -> bool on the device
                if self.cuda_graph:
                    out = self._graph_for(last).replay()
                else:
                    out = self.policy(obs, mask)
                actions, extras = out if isinstance(out, tuple) else (out, None)
                if not isinstance(actions, torch.Tensor):  # NumPy, a list, an int
                    actions = _tensor_of(actions, "actions", ActionError)
                self._keep(buf, t, actions, extras)
                last = step(actions)
                self._ends(buf, t)
        self._last = last
        self._observe(self._rows_of(buf.next_observations, None), last)
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
        differ), captured the first time it is seen. The client returns its plan's own
        ``TensorStep`` each step (fixed tensors): the same object, the same graph."""
        seen = self._graph_last
        if seen is not None and seen[0] is last:
            return seen[1]
        key = tuple(int(last[name].data_ptr()) for name in self._graph_inputs)
        graph = self._graphs.get(key)
        if graph is None:
            if len(self._graphs) >= 4:  # the client replaced its buffers: drop the old graphs
                self._graphs.clear()
            graph = _PolicyGraph(self.policy, last, self.obs_names, self.mask_name)
            self._graphs[key] = graph
        self._graph_last = (last, graph)
        return graph

    def _rows_of(self, into: Any, t: int | None) -> list[tuple[str, Any]]:
        """``(field name, row t of into)`` per observation field (``into`` itself: None)."""
        rows = []
        for name in self.obs_names:
            kept = into[name] if self.dict_obs else into
            rows.append((name, kept if t is None else kept[t]))
        return rows

    def _observe(self, rows: list[tuple[str, Any]], result: TensorStep) -> Any:
        """Copy ``result``'s observation field(s) into ``rows`` (``_rows_of``); the row(s)."""
        copy = self.client._copy_on_device
        for name, row in rows:
            copy(row, result[name])
        return dict(rows) if self.dict_obs else rows[0][1]

    def _keep(
        self, buf: RolloutBuffer, t: int, actions: Any, extras: dict[str, Any] | None
    ) -> None:
        """Step t's actions and extras into the buffer (allocated at the first step, by the
        policy's shapes and dtypes; their rows made once)."""
        kept = self._kept_rows
        whole = buf.actions
        if whole is None:
            shape = (buf.steps, *actions.shape)
            whole = buf.actions = torch.zeros(shape, dtype=actions.dtype, device=self.client.device)
        rows = kept.get(_ACTIONS)
        if rows is None or rows[0] is not whole:
            rows = kept[_ACTIONS] = [whole, *whole]
        copy = self.client._copy_on_device
        copy(rows[t + 1], actions, False)
        if not extras:
            return
        for name, value in extras.items():
            if not isinstance(value, torch.Tensor):  # NumPy, a list, a number (a value)
                value = _tensor_of(value, f"extra {name!r}", AdapterError)
            whole = buf.extras.get(name)
            if whole is None:
                shape = (buf.steps, *value.shape)
                whole = buf.extras[name] = torch.zeros(
                    shape, dtype=value.dtype, device=self.client.device
                )
            rows = kept.get(name)
            if rows is None or rows[0] is not whole:
                rows = kept[name] = [whole, *whole]
            copy(rows[t + 1], value, False)

    def _ends(self, buf: RolloutBuffer, t: int) -> None:
        """Step t's reward and end flags, on the host from the client's NumPy view (written in
        place into the host rows: a few ufuncs, no temporaries); an ended episode's come from
        its final result, which ``buf.finals`` keeps as tensors."""
        view = self.client.view
        assert view is not None
        rewards, terminated, truncated, dones = self._host_rows[t]
        rewards[...] = view[self.reward_name]
        np.not_equal(view[self.ended_name], 0, out=terminated)  # "ended" until the flags below
        cut = self.truncated_name
        if cut is not None:
            np.not_equal(view[cut], 0, out=truncated)
        finals = self.client.client.finals
        if finals:
            # the ended envs' final records, stacked once (CUDA: straight into the pinned
            # stage); their reward and flags patched into the rows, one array operation each
            count = len(finals)
            at = np.empty(count, dtype=np.intp)
            records = self._final_records(finals[0][1].record.dtype, count)
            for k, (index, final) in enumerate(finals):
                at[k] = index
                records[k] = final.record
            rewards[at] = records[self.reward_name]
            terminated[at] = records[self.ended_name] != 0
            if cut is not None:
                truncated[at] = records[cut] != 0
            stacked = self._stack_finals(records)
            append = buf.finals.append
            for k, index in enumerate(at.tolist()):
                append((t, index, TensorStep(_FinalRow(stacked, k))))
        if cut is None:
            truncated[...] = False
            dones[...] = terminated
            return
        if self.ended_is_done:  # terminated = done and not truncated
            np.greater(terminated, truncated, out=terminated)
        np.logical_or(terminated, truncated, out=dones)

    def _final_records(self, dtype: np.dtype[Any], count: int) -> np.ndarray:
        """Where a step's ``count`` final records are stacked: an owned array (CPU: the finals'
        tensors view it), or the first rows of the pinned stage (CUDA: copied from there)."""
        if not self._staged:
            return np.empty(count, dtype=dtype)
        stage = self._finals_stage
        if stage is None or stage.dtype != dtype:
            stage = self._finals_stage = _FinalsStage(dtype, self.client.num_envs)
        return stage.records[:count]

    def _stack_finals(self, records: np.ndarray) -> _Stacked:
        """The step's final results (``records``) by field, each a (count, ...) tensor made
        when first read (``_Stacked``), over one block of the records' bytes: on the CPU the
        stacked records themselves, on CUDA a fresh device block (the finals of earlier steps
        stay intact) that ONE asynchronous copy from the pinned stage fills."""
        fields = self._final_fields
        if fields is None or fields.dtype != records.dtype:
            fields = self._final_fields = _FinalFields(records.dtype)
        if not self._staged:
            return _Stacked(torch.from_numpy(records.view(np.uint8)), len(records), fields)
        return _Stacked(self._stage_finals(records), len(records), fields)

    def _stage_finals(self, records: np.ndarray) -> Any:
        """One asynchronous copy of the staged final records (the first rows of the pinned
        stage) to a fresh device block, on the current stream; the block.

        The stage is reused at the next step with finals: its copy must have read it by then.
        It has: the copy is queued before the client marks its copies (``_mark_copied``), and
        the next step's request waits for that mark (``TorchClient._settle``) before this
        collector stages again (``_ends`` runs after ``client.step``)."""
        client = self.client
        nbytes = records.nbytes
        block = torch.empty(nbytes, dtype=torch.uint8, device=client.device)
        runtime = client._runtime
        if runtime is not None:  # ~1 us of host time; copy_ costs several
            stream = client._stream()
            runtime.copy(block.data_ptr(), _address(records), nbytes, stream)
            client._mark_copied(stream)
        else:
            stage = self._finals_stage
            assert stage is not None
            block.copy_(stage.host[:nbytes], non_blocking=True)
            client._mark_copied(None)
        return block

    def _episodes(self, buf: RolloutBuffer) -> None:
        """The returns and lengths of the episodes that ended in this rollout (from the host
        arrays: no device sync), in step order, then env order within a step."""
        rewards = self._rewards.astype(np.float64)
        returns, lengths, dones = self._returns, self._lengths, self._dones
        ends = dones.any(axis=1).tolist()
        buf.episode_returns = []
        buf.episode_lengths = []
        # lengths[i] + t + 1 is env i's episode length at step t: an end at t records it and
        # sets lengths[i] = -(t + 1) (the next episode starts at t + 1); the steps are added
        # once at the end. Returns are summed step by step (the same float additions).
        for t in range(buf.steps):
            returns += rewards[t]
            if ends[t]:
                ended = np.flatnonzero(dones[t])
                buf.episode_returns += returns[ended].tolist()
                buf.episode_lengths += (lengths[ended] + (t + 1)).tolist()
                returns[ended] = 0.0
                lengths[ended] = -(t + 1)
        lengths += buf.steps


def _tensor_of(value: Any, what: str, error: type[Exception]) -> Any:
    """A policy's output that is not a tensor (a NumPy array, a list, a number) as one, on the
    host: ``torch.as_tensor`` (an array's memory shared where torch can view it; a read-only
    or negatively strided array is copied). ``error`` (ActionError for actions, AdapterError
    for extras) naming ``what`` where it holds no numbers of one shape."""
    try:
        if isinstance(value, np.ndarray) and not value.flags.writeable:
            value = value.copy()  # torch would share it and warn that it is not writable
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        pass
    try:
        return torch.from_numpy(np.ascontiguousarray(value))  # negative strides, say
    except (TypeError, ValueError, RuntimeError) as exc:
        raise error(
            f"the policy returned {what} as {type(value).__name__}, which is not numbers of one "
            f"shape ({str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}): return "
            "tensors (NumPy arrays, lists of numbers and numbers are made tensors)"
        ) from None


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
        actions, extras = self.out if isinstance(self.out, tuple) else (self.out, None)
        outputs = {"actions": actions, **{f"extra {k!r}": v for k, v in (extras or {}).items()}}
        for what, value in outputs.items():
            if not isinstance(value, torch.Tensor):
                raise AdapterError(
                    f"cuda_graph=True: the policy returned {what} as {type(value).__name__}, "
                    "not a tensor: a replay reruns the captured kernels only, so it would be "
                    "the capture's value at every step; return tensors, or pass cuda_graph=False"
                )

    def replay(self) -> Any:
        self.graph.replay()
        return self.out


class _FinalFields:
    """Where each field (of a torch dtype) of a final record lies: ``(offset, bytes, element
    size, torch dtype, shape)`` by name, in the record's field order."""

    def __init__(self, dtype: np.dtype[Any]) -> None:
        self.dtype = dtype
        self.itemsize = dtype.itemsize
        self.fields: dict[str, tuple[int, int, int, Any, tuple[int, ...]]] = {}
        for name, offset, width, size, tdtype, shape in _record_fields(dtype, []):
            self.fields[name] = (offset, width, size, tdtype, shape)

    def stacked(self, block: Any, count: int, name: str) -> Any:
        """Field ``name`` of the ``count`` records in ``block`` (their bytes, back to back)
        as a (count, ...) tensor: a strided view of the block where the field's elements are
        aligned in it, else an owned copy of its bytes (a packed record: a kernel, once)."""
        offset, width, size, tdtype, shape = self.fields[name]
        if not width:
            return torch.empty((count, *shape), dtype=tdtype, device=block.device)
        rows = block.view(count, self.itemsize)[:, offset : offset + width]
        if offset % size or self.itemsize % size or block.data_ptr() % size:
            own = torch.empty((count, width), dtype=torch.uint8, device=block.device)
            rows = own.copy_(rows)  # standard strides, whatever the count
        return rows.view(tdtype).reshape(count, *shape)


class _Stacked(Mapping[str, Any]):
    """A step's final results, field by field as (count, ...) tensors over one block of the
    stacked records' bytes, each made when first read (most finals are never read)."""

    __slots__ = ("_block", "_count", "_fields", "_made")

    def __init__(self, block: Any, count: int, fields: _FinalFields) -> None:
        self._block, self._count, self._fields = block, count, fields
        self._made: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        made = self._made.get(name)
        if made is None:
            made = self._made[name] = self._fields.stacked(self._block, self._count, name)
        return made

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields.fields)

    def __len__(self) -> int:
        return len(self._fields.fields)


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
    """A pinned host buffer for a step's final records (up to ``num_envs``, stacked as the
    records' own dtype), so that they travel to the device in one copy of their bytes."""

    def __init__(self, dtype: np.dtype[Any], num_envs: int) -> None:
        self.dtype = dtype
        pinned = torch.cuda.is_available()  # pinned for the device's asynchronous copy
        self.host = torch.empty(
            max(num_envs * dtype.itemsize, 1), dtype=torch.uint8, pin_memory=pinned
        )
        self.records: np.ndarray = self.host.numpy()[: num_envs * dtype.itemsize].view(dtype)
