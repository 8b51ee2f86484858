"""transport.torch (issue 25 items 1 and 4): results as torch tensors over real servers.

CPU: every field is a view of the client's zero-copy NumPy view (same data_ptr, no copy),
values equal the NumPy path bit for bit, and a tensor kept past the next step or past close()
never reads freed memory (checked in a subprocess: a fault fails the test, not the run). The
CUDA path is checked where a GPU exists and skipped with the reason elsewhere.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import transport  # noqa: E402
import transport.torch as tt  # noqa: E402
from transport import cudart  # noqa: E402
from transport.errors import AdapterError, TransportError  # noqa: E402

from .servers import ROOT, ServerProcess, unique_url  # noqa: E402

TETRIS = str(ROOT / "schema" / "tetris.toml")
N = 4
STEPS = 12
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device: the CUDA path runs on a GPU")


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, ServerProcess]]:
    """The contract env on the tetris schema (natural layout): one server per backend."""
    procs: dict[str, ServerProcess] = {}
    try:
        for backend in ("shm", "unix"):
            procs[backend] = ServerProcess(
                unique_url(backend), env="contract", num_envs=N, extra=["--schema", TETRIS]
            )
        yield procs
    finally:
        for proc in procs.values():
            proc.__exit__(None, None, None)


@pytest.fixture(params=["shm", "unix"])
def server(request: pytest.FixtureRequest, servers: dict[str, ServerProcess]) -> ServerProcess:
    return servers[request.param]


def legal_actions(mask: np.ndarray) -> np.ndarray:
    """The largest legal action of each env, never the contract env's poison action 1."""
    allowed = np.asarray(mask).astype(bool).copy()
    allowed[:, 1] = False
    return np.asarray((allowed * np.arange(allowed.shape[1])).argmax(axis=1), dtype=np.int64)


def numpy_trace(url: str) -> list[dict[str, bytes]]:
    """The plain client's results (and finals) for the fixed action rule: the reference."""
    trace = []
    with transport.connect(url, TETRIS, autoreset="same_step") as client:
        view = client.reset(seed=7)
        trace.append({name: view[name].tobytes() for name in view})
        for _ in range(STEPS):
            view = client.step(legal_actions(view["action_mask"]))
            row = {name: view[name].tobytes() for name in view}
            for index, final in client.finals:
                row.update({f"final{index}.{name}": final[name].tobytes() for name in final})
            trace.append(row)
    return trace


def tensor_bytes(tensor: Any) -> bytes:
    return bytes(tensor.detach().cpu().contiguous().numpy().tobytes())


def test_cpu_tensors_view_the_numpy_views(server: ServerProcess) -> None:
    with tt.connect(server.url, TETRIS, device="cpu", autoreset="same_step") as client:
        result = client.reset(seed=7)
        for _ in range(3):
            view = client.view
            assert view is not None
            for name in result:
                array = view[name]
                assert result[name].data_ptr() == array.__array_interface__["data"][0], name
                assert tuple(result[name].shape) == array.shape
                assert result[name].stride() == tuple(s // array.itemsize for s in array.strides)
            assert client.copied_fields == []
            result = client.step(torch.from_numpy(legal_actions(result.action_mask.numpy())))


def test_values_equal_the_numpy_path(server: ServerProcess) -> None:
    expected = numpy_trace(server.url)
    got = []
    with tt.connect(server.url, TETRIS, device="cpu", autoreset="same_step") as client:
        result = client.reset(seed=7)
        got.append({name: tensor_bytes(result[name]) for name in result})
        for _ in range(STEPS):
            actions = torch.from_numpy(legal_actions(result.action_mask.numpy()))
            result = client.step(actions)  # int64 tensor into the i32 action field
            row = {name: tensor_bytes(result[name]) for name in result}
            for index, final in client.finals:
                row.update({f"final{index}.{name}": tensor_bytes(final[name]) for name in final})
            got.append(row)
    assert any(key.startswith("final") for row in expected for key in row)  # episodes ended
    assert got == expected


def test_copy_true_gives_owned_tensors(server: ServerProcess) -> None:
    with tt.connect(server.url, TETRIS, device="cpu", autoreset="same_step") as client:
        first = client.reset(seed=7, copy=True)
        view = client.view
        assert view is not None
        assert first.observation.data_ptr() != view["observation"].__array_interface__["data"][0]
        before = first.observation.clone()
        client.step(torch.from_numpy(legal_actions(first.action_mask.numpy())))
        assert torch.equal(first.observation, before)


LIFETIME = textwrap.dedent(
    """
    import gc, sys
    import numpy as np, torch
    import transport.torch as tt
    schema = sys.argv[1]

    def actions(mask):
        allowed = mask.numpy().astype(bool).copy()
        allowed[:, 1] = False
        return torch.from_numpy((allowed * np.arange(allowed.shape[1])).argmax(axis=1))

    for url in sys.argv[2:]:
      client = tt.connect(url, schema, device="cpu", autoreset="same_step")
      first = client.reset(seed=3)
      kept = first.observation            # a view: the next step rewrites what it shows
      second = client.step(actions(first.action_mask))
      assert kept.data_ptr() == second.observation.data_ptr()
      at_close = second.observation.clone()
      mask = second.action_mask
      client.close()
      del first, second
      gc.collect()
      assert torch.equal(kept, at_close), "a kept tensor changed at close"
      float(kept.sum()); int(mask.sum())   # read: a freed mapping would fault here
      try:
          client.step(actions(mask))
      except Exception as exc:
          assert "closed" in str(exc), exc
      else:
          raise AssertionError("a closed client stepped")
      # another client of the same server: its steps must not show through the kept tensors
      other = tt.connect(url, schema, device="cpu", autoreset="same_step")
      result = other.reset(seed=99)
      for _ in range(3):
          result = other.step(actions(result.action_mask))
      other.close()
      assert torch.equal(kept, at_close), "a kept tensor saw another client's steps"
      del result, other
      gc.collect()
      print("ok", float(kept.sum()))
    """
)


def test_kept_tensors_never_read_freed_memory(servers: dict[str, ServerProcess]) -> None:
    """shm and unix in one subprocess (importing torch is the cost)."""
    urls = [proc.url for proc in servers.values()]
    proc = subprocess.run(
        [sys.executable, "-c", LIFETIME, TETRIS, *urls],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.count("ok ") == len(urls)


def test_closed_client_refuses(server: ServerProcess) -> None:
    client = tt.connect(server.url, TETRIS)
    client.close()
    assert "closed" in repr(client)
    with pytest.raises(TransportError, match="closed"):
        client.reset()


class _HostOwner:
    """A stand-in for a CUDA TorchClient with the CPU as the device: the device plan's block
    layout and field slicing run here without a GPU."""

    device = torch.device("cpu")
    cuda = False

    def __init__(self, span: tuple[int, int] | None = None) -> None:
        self.span = span  # the "registered" region, if any

    def _registered_span(self, address: int, nbytes: int) -> bool:
        return tt.TorchClient._registered_span(self, address, nbytes)  # type: ignore[arg-type]

    @property
    def _registered(self) -> tuple[int, int] | None:
        return self.span


def check_device_slicing(view: Any, owner: _HostOwner | None = None) -> list[str]:
    """The CUDA path's slicing of ``view``'s records block equals the NumPy fields; returns
    the fields that need a device gather (unaligned)."""
    owner = owner or _HostOwner()
    plan = tt._DevicePlan(owner, view)  # type: ignore[arg-type]
    if owner.span is None:
        assert plan.stage is not None
        np.copyto(plan.stage, plan.host)  # what refresh() does, minus the stream
    else:  # the DMA reads the registered region itself: the records' block, no copy
        assert plan.stage is None
        assert plan.source.data_ptr() == view.record.__array_interface__["data"][0]
    plan.target.copy_(plan.source)
    for raw, own in plan.gathers:
        own.copy_(raw)
    for name in view:
        array = view[name]
        assert tuple(plan.fields[name].shape) == array.shape, name
        assert tensor_bytes(plan.fields[name]) == np.ascontiguousarray(array).tobytes(), name
    return list(plan.copied)


def test_device_slicing_equals_the_numpy_fields(server: ServerProcess) -> None:
    with transport.connect(server.url, TETRIS, autoreset="same_step") as client:
        view = client.reset(seed=7)
        assert check_device_slicing(view) == []
        for _ in range(3):
            view = client.step(legal_actions(view["action_mask"]))
            assert check_device_slicing(view) == []


class _RowCopies:
    """A host stand-in for ``cudart.CudaRuntime``: ``cudaMemcpy2DAsync``'s contract (``width``
    bytes every ``pitch`` bytes into ``rows * width`` contiguous bytes) done row by row."""

    def copy_strided(self, plan: Any, stream: int) -> None:
        for row in range(plan.rows):
            to = plan.target + row * (plan.target_pitch or plan.width)
            ctypes.memmove(to, plan.source + row * plan.pitch, plan.width)


class _StridedOwner(_HostOwner):
    _runtime = _RowCopies()

    def _stream(self) -> int:
        return 0

    def _mark_copied(self, stream: int | None) -> None:
        self.marked = stream


def check_strided_copies(view: Any) -> int:
    """The strided plan's copies (from the slots) give each field's bytes; a large or
    unaligned field is contiguous in a tensor of its own; returns the number of copies."""
    plan = tt._StridedPlan(_StridedOwner(), view)  # type: ignore[arg-type]
    step = plan.refresh(_StridedOwner())  # type: ignore[arg-type]
    assert plan.copied == [] and plan.skipped == []
    assert list(step) == list(view)
    for name in view:
        array = view[name]
        tensor = step[name]
        assert tuple(tensor.shape) == array.shape, name
        if array[...].nbytes // max(1, len(array) if array.ndim else 1) >= tt.OWN_COPY_BYTES:
            assert tensor.is_contiguous(), name
        assert tensor_bytes(tensor) == np.ascontiguousarray(array).tobytes(), name
    assert [copy.width for copy in plan.copies] == sorted(
        (copy.width for copy in plan.copies), reverse=True
    )
    return len(plan.copies)


def test_strided_copies_equal_the_numpy_fields(servers: dict[str, ServerProcess]) -> None:
    """The registered slot path's copy plan (issue 25: only the fields' bytes move): each
    field's source address, pitch and width, checked against the shm slots of a real server."""
    with transport.connect(servers["shm"].url, TETRIS, autoreset="same_step") as client:
        view = client.reset(seed=7)
        assert check_strided_copies(view) == 2  # the observation; the rest in one span
        for _ in range(3):
            view = client.step(legal_actions(view["action_mask"]))
            check_strided_copies(view)


def test_strided_copies_of_a_packed_record() -> None:
    """Unaligned fields (a packed record) land aligned in their tensors: no gather kernel."""
    dtype = np.dtype([("flag", "u1"), ("obs", "<f4", (3, 5)), ("reward", "<f8"), ("id", "<i2")])
    slots = np.zeros(6 * 160, dtype=np.uint8)
    records = np.ndarray((6,), dtype=dtype, buffer=slots, offset=3, strides=(160,))
    rng = np.random.default_rng(1)
    for name in dtype.names or ():
        records[name] = rng.integers(0, 100, size=records[name].shape)
    from transport.step_view import StepView

    assert check_strided_copies(StepView(records)) == 4  # flag's span; three unaligned fields
    assert check_strided_copies(StepView(records[2])) == 4  # one record


class _DeviceCopies:
    """A host stand-in for the runtime's ``cudaMemcpyAsync`` within a device (a memmove)."""

    def __init__(self) -> None:
        self.copies: list[tuple[int, int, int, int]] = []

    def copy_on_device(self, target: int, source: int, nbytes: int, stream: int) -> None:
        self.copies.append((target, source, nbytes, stream))
        ctypes.memmove(target, source, nbytes)


class _CopyOwner:
    """What ``TorchClient._copy_on_device`` reads of its client (the device a CPU one)."""

    def __init__(self) -> None:
        self._runtime = _DeviceCopies()
        self.device = torch.device("cpu")

    def _stream(self) -> int:
        return 7


def test_copies_within_the_device_use_the_runtime_where_they_can() -> None:
    """The collector's buffer copies (observations, actions, extras): a contiguous source of
    the target's dtype and shape is one runtime copy of its bytes on the current stream; any
    other (a dtype to convert, a strided view) is ``copy_``; the values are the source's."""
    owner = _CopyOwner()
    copy = tt.TorchClient._copy_on_device
    source = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    target = torch.zeros(3, 4, 6)[1]
    copy(owner, target, source)  # type: ignore[arg-type]
    assert owner._runtime.copies == [(target.data_ptr(), source.data_ptr(), 96, 7)]
    assert torch.equal(target, source)
    for other, into in (
        (torch.arange(24, dtype=torch.uint8).reshape(4, 6), torch.zeros(4, 6, dtype=torch.bool)),
        (torch.arange(48.0).reshape(4, 12)[:, ::2], torch.zeros(4, 6)),  # strided
        (torch.arange(24.0).reshape(4, 6), torch.zeros(6, 4).t()),  # strided target
    ):
        copy(owner, into, other)  # type: ignore[arg-type]
        assert torch.equal(into, other.to(into.dtype))
    assert len(owner._runtime.copies) == 1


def test_the_cuda_runtime_is_found_in_the_process_maps() -> None:
    maps = (
        "7f00-7f10 r-xp 00000000 08:01 42 /usr/lib/libc.so.6\n"
        "7f20-7f30 r-xp 00000000 08:01 43 /site/nvidia/cu13/lib/libcudart.so.13\n"
    )
    assert cudart.runtime_path(maps) == "/site/nvidia/cu13/lib/libcudart.so.13"
    assert cudart.runtime_path("7f00-7f10 r-xp 00000000 08:01 42 /usr/lib/libc.so.6\n") is None
    assert cudart.load("") is None  # absent: transport.torch keeps torch's own copies


def test_region_span_covers_the_results(server: ServerProcess) -> None:
    """What cudaHostRegister pins: the whole shm mapping, which holds every result record;
    a stream backend has none (its records go through a pinned staging buffer)."""
    with transport.connect(server.url, TETRIS) as client:
        view = client.reset(seed=7)
        span = tt.region_span(client)
        if not server.url.startswith("shm://"):
            assert span is None
            return
        assert span is not None
        base, size = span
        records = view.record
        start = records.__array_interface__["data"][0]
        end = start + (records.shape[0] - 1) * records.strides[0] + records.dtype.itemsize
        assert base <= start and end <= base + size
        assert check_device_slicing(view, _HostOwner(span)) == []


def test_packed_layout_fields_are_copied_and_named() -> None:
    """pac_env's 2557-byte packed wire record over a socket: its multi-byte fields have a row
    stride that is no multiple of their element size, so they are copied (and said so)."""
    url = unique_url("unix")
    with ServerProcess(url, env="echo", num_envs=2) as proc:
        with transport.connect(proc.url) as plain:
            plain.reset(seed=1)
            want = plain.step(np.array([3, 5]), copy=True)
        with tt.connect(proc.url, device="cpu") as client:
            client.reset(seed=1)
            got = client.step(torch.tensor([3, 5]))
            assert "observation" in client.copied_fields
            assert "action_mask" not in client.copied_fields  # u8: any stride is a view
            for name in want:
                assert tensor_bytes(got[name]) == want[name].tobytes(), name
            assert "observation" in check_device_slicing(client.client.step(np.array([3, 5])))


def test_device_is_chosen_at_connect_and_shown() -> None:
    device, why = tt.choose_device(None)
    if CUDA:
        assert device.type == "cuda"
    else:
        assert device.type == "cpu" and "fallback" in why
    assert tt.choose_device("cpu")[0].type == "cpu"
    with pytest.raises(AdapterError, match="not a torch device"):
        tt.choose_device("no-such-device")
    with pytest.raises(AdapterError, match="only cpu and cuda"):
        tt.choose_device("meta")


@pytest.mark.skipif(CUDA, reason="checks the refusal where CUDA is absent")
def test_cuda_asked_without_cuda_is_refused_before_connecting() -> None:
    with pytest.raises(AdapterError, match="no CUDA device"):
        tt.connect("unix:///nonexistent/never.sock", device="cuda")


def test_repr_names_device_and_path(server: ServerProcess) -> None:
    with tt.connect(server.url, TETRIS) as client:
        text = repr(client)
        assert f"{N} envs" in text and "device=" in text and "path=" in text
        if not CUDA:
            assert "CPU fallback" in text and "zero-copy views" in text


@needs_cuda
def test_cuda_values_equal_the_numpy_path(server: ServerProcess) -> None:
    expected = numpy_trace(server.url)
    got = []
    with tt.connect(server.url, TETRIS, device="cuda", autoreset="same_step") as client:
        if server.url.startswith("shm://"):
            assert "registered shm region, strided copies of the records' fields" in repr(client)
        result = client.reset(seed=7)
        assert result.observation.device.type == "cuda"
        if server.url.startswith("shm://"):
            assert result.observation.is_contiguous()  # in a tensor of its own
        got.append({name: tensor_bytes(result[name]) for name in result})
        for _ in range(STEPS):
            mask = result.action_mask.cpu().numpy()
            actions = torch.from_numpy(legal_actions(mask)).cuda()  # device -> host actions
            result = client.step(actions)
            row = {name: tensor_bytes(result[name]) for name in result}
            for index, final in client.finals:
                row.update({f"final{index}.{name}": tensor_bytes(final[name]) for name in final})
            got.append(row)
    assert got == expected


@needs_cuda
def test_cuda_tensors_outlive_close(server: ServerProcess) -> None:
    client = tt.connect(server.url, TETRIS, device="cuda")
    result = client.reset(seed=7, copy=True)
    kept = result.observation
    client.close()
    assert kept.device.type == "cuda"
    assert torch.isfinite(kept).all()


def test_the_core_never_imports_torch() -> None:
    """torch is an optional extra: only transport.torch and transport.rollout import it."""
    code = (
        "import sys, transport, transport.client, transport.api, transport.collector\n"
        "import transport.backends.shm.channel, transport.backends.unix\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=needs_cuda)], ids=["cpu", "cuda"]
)
def test_tensor_actions_follow_the_clients_action_rule(server: ServerProcess, device: str) -> None:
    """Float actions into the i32 field are refused as a NumPy array's are (no silent cast)."""
    with tt.connect(server.url, TETRIS, device=device) as client:
        client.reset(seed=7)
        with pytest.raises(transport.ActionError, match="truncated"):
            client.step(torch.full((N,), 0.5, device=device))
        with pytest.raises(transport.ActionError, match=f"expected {N} actions"):
            client.step(torch.zeros(N + 1, dtype=torch.int64, device=device))


def test_gpu_bench_runs_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/gpu_bench.py stays runnable: its transfer and policy tables on the CPU
    (the CUDA columns n/a); the collector section runs in the benchmark itself."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "benchmarks" / "gpu_bench.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = ["--device", "cpu", "--only", "transfer", "--only", "policy", "--reps", "5"]
    threads = torch.get_num_threads()
    try:
        assert bench.main([*argv, "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "torch=" in out and "256 x u8[3,84,84]" in out and "| 1024 |" in out
    assert out.count("n/a") >= 8 + 3  # two CUDA columns x four batches, one per policy row


def test_a_tensor_step_copies_and_pickles() -> None:
    """``copy.copy`` / ``pickle`` look special methods up on an instance made without
    ``__init__``: ``TensorStep.__getattr__`` must not recurse through its unset fields."""
    import copy
    import pickle

    step = tt.TensorStep({"reward": torch.arange(3.0)})
    for again in (copy.copy(step), pickle.loads(pickle.dumps(step))):
        assert list(again) == ["reward"] and torch.equal(again.reward, step.reward)
