"""Device benchmark (issue 25 item 5): observations to a device, and the batched collector.

    python benchmarks/gpu_bench.py                  # CUDA if torch sees it, else the CPU
    python benchmarks/gpu_bench.py --device cpu     # the CUDA-only columns print n/a
    python benchmarks/gpu_bench.py --device cuda --budget 200 --json out.json

Unattended and bounded: no prompts, every measurement stops at its repetitions or its share of
``--budget`` seconds (default 200, under 4 minutes with the servers' start-up), a failing
section prints its error and the run goes on (exit status 1 at the end). It prints the
environment first (Python, torch, CUDA, device name, CPU count).

1. **Transfer** (median per batch; the destination is a contiguous tensor on the device) for
   this project's shm slot layouts: pac_env's Appendix B slots (5120 bytes, f32[612] at 32)
   and a derived-layout image schema (u8[3,84,84]); N = 32 and 256:
   naive (the strided slot view ``.to(device)``), host copy then ``.to``, the
   ``transport.torch`` paths (region registered with ``cudaHostRegister``; each field of the
   slots copied by one strided ``cudaMemcpy2DAsync`` into its contiguous tensor, and the
   fallback: the slots' block copied, the field sliced on the device, made contiguous), the
   column layout
   (``[env] shm = "columns"``: a real column region of the same observation, image_columns
   and an f32[612] columns schema; ``transport.torch``'s one copy of every result column from
   the registered region; on the CPU its zero-copy ``from_numpy``), and the struct-of-arrays floor
   (a contiguous registered buffer of the field alone, one copy).
2. **Policy**: a 612-256-256-92 MLP with masks and sampling, actions back on the host, at
   N = 32, 256, 1024 on the CPU and on the device.
3. **Collector**: end-to-end env-steps/s of ``transport.rollout.RolloutCollector`` over shm://
   at N = 32, 256, 1024 with the echo env (Python server) and the Tetris env (Node server:
   skipped with the reason when node or node_bridge/dist is missing), and the collector's own
   time per step (transfer + inference + buffer writes: the step minus the server round trip).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

try:
    import torch
except ImportError:  # pragma: no cover - said once, clearly
    sys.exit("gpu_bench: torch is not installed (pip install torch)")

from transport.backends.shm.region import (  # noqa: E402
    CONTROL_SIZE,
    ColumnRecords,
    ShmLayout,
    column_views,
)
from transport.codec import Schema  # noqa: E402
from transport.generated import image_columns, pac_env  # noqa: E402

IMAGE_SCHEMA = """
[schema]
name = "gpu_bench_image"
version = 1
layout = "natural"

[env]
result = "StepResult"
request = "StepRequest"

[structs.StepResult]
fields = [
  { name = "observation", type = "u8[3,84,84]", role = "observation" },
  { name = "action_mask", type = "u8[18]",      role = "action_mask" },
  { name = "reward",      type = "f32",         role = "reward" },
  { name = "done",        type = "u8",          role = "done" },
]

[structs.StepRequest]
fields = [{ name = "action", type = "i32", role = "action" }]
"""

COLUMNS_F32_SCHEMA = """
[schema]
name = "gpu_bench_columns"
version = 1
layout = "natural"

[env]
result = "StepResult"
request = "StepRequest"
shm = "columns"

[structs.StepResult]
fields = [
  { name = "observation", type = "f32[612]", role = "observation" },
  { name = "action_mask", type = "u8[92]",   role = "action_mask" },
  { name = "reward",      type = "f32",      role = "reward" },
  { name = "done",        type = "u8",       role = "done" },
]

[structs.StepRequest]
fields = [{ name = "action", type = "i32", role = "action" }]
"""
"""A pac-sized observation in the shm column layout (the f32[612] row's "column layout")."""

NA = "n/a"


class Budget:
    """The run's time budget: each measurement asks how much is left."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def median_us(fn: Callable[[], Any], sync: Callable[[], Any], reps: int, limit: float) -> float:
    """Median microseconds of ``fn(); sync()`` over ``reps`` (fewer if ``limit`` s pass)."""
    for _ in range(min(5, reps)):
        fn()
        sync()
    times = []
    stop = time.monotonic() + limit
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
        if time.monotonic() > stop and len(times) >= 5:
            break
    return statistics.median(times) * 1e6


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: Any) -> dict[str, Any]:
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cuda_available": torch.cuda.is_available(),
        "torch_cuda": torch.version.cuda,
        "device": str(device),
        "device_name": (
            torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
        ),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "host": platform.node(),
        "node": shutil.which("node") or "",
    }
    return info


# -- 1. transfer ---------------------------------------------------------------------------------


def _layout_of(text: str, name: str) -> ShmLayout:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.toml"
        path.write_text(text)
        from transport.schema import load_schema

        return ShmLayout.of(Schema(load_schema(str(path))))


def layouts() -> list[tuple[str, ShmLayout, ShmLayout]]:
    """(name, slot layout, column layout): pac_env's Appendix B slots and a derived-layout
    image schema's, each with a column-layout schema of the same observation."""
    image = _layout_of(IMAGE_SCHEMA, "gpu_bench_image")
    f32_columns = _layout_of(COLUMNS_F32_SCHEMA, "gpu_bench_columns")
    return [
        ("f32[612]", ShmLayout.of(pac_env.SCHEMA), f32_columns),
        ("u8[3,84,84]", image, ShmLayout.of(image_columns.SCHEMA)),
    ]


class Region:
    """An anonymous shared mapping laid out as an shm region: the control block, then N slots
    whose result records sit where the layout puts them (``records``: the client's view)."""

    def __init__(self, n: int, layout: ShmLayout) -> None:
        self.size = CONTROL_SIZE + n * layout.slot_size
        self.map = mmap.mmap(-1, self.size)
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)
        self.address = self.bytes.__array_interface__["data"][0]
        self.records = np.ndarray(
            (n,), dtype=layout.result_dtype, buffer=self.map,
            offset=CONTROL_SIZE + layout.result_base, strides=(layout.slot_size,),
        )  # fmt: skip
        self.view = self.records["observation"]  # (n, *shape), row stride = the slot size
        rng = np.random.default_rng(0)
        self.view[...] = rng.integers(0, 100, size=self.view.shape).astype(self.view.dtype)


class ColumnRegion:
    """An anonymous shared mapping laid out as a column-layout shm region of ``n`` slots: the
    result columns after the slots and final areas (``records``: the client's ColumnRecords)."""

    def __init__(self, n: int, layout: ShmLayout) -> None:
        self.size = layout.region_size(n)
        self.map = mmap.mmap(-1, self.size)
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)
        self.address = self.bytes.__array_interface__["data"][0]
        _, results = column_views(layout, self.map, n)
        self.records = ColumnRecords(layout.result.dtype, results, n)
        self.view = results["observation"]  # (n, *shape), contiguous
        rng = np.random.default_rng(0)
        self.view[...] = rng.integers(0, 100, size=self.view.shape).astype(self.view.dtype)


def transfer_table(device: Any, reps: int, budget: Budget) -> list[dict[str, Any]]:
    rows = []
    for name, layout, columns in layouts():
        for n in (32, 256):
            if budget.left() < 10:
                rows.append({"batch": f"{n} x {name}", "error": "skipped: time budget"})
                continue
            region = Region(n, layout)
            limit = min(5.0, budget.left() / 24)
            row = transfer_row(name, region, device, reps, limit)
            try:
                row["columns"] = column_path(ColumnRegion(n, columns), device, reps, limit)
            except Exception as exc:  # said in the cell; the other columns stand
                row["columns"] = f"{type(exc).__name__}: {exc}"
            for key in ("registered", "columns"):
                value, floor = row.get(key), row.get("soa_floor")
                if isinstance(value, float) and isinstance(floor, float) and floor > 0:
                    row[key.replace("registered", "slot") + "_ratio"] = f"{value / floor:.2f}x"
            rows.append(row)
    return rows


def transfer_row(name: str, region: Region, device: Any, reps: int, limit: float) -> dict[str, Any]:
    """One batch's columns (CUDA: all four; CPU: the two copies, the CUDA columns n/a)."""
    view = region.view
    n = view.shape[0]
    row: dict[str, Any] = {"batch": f"{n} x {name} ({view[0].nbytes * n / 1024:.0f} KB)"}
    if device.type == "cuda":
        sync = torch.cuda.synchronize
        row["naive"] = median_us(lambda: torch.from_numpy(view).to(device), sync, reps, limit)
        row["host_copy"] = median_us(
            lambda: torch.from_numpy(np.ascontiguousarray(view)).to(device), sync, reps, limit
        )
        row["slot_block"] = registered_path(region, device, reps, limit, strided=False)
        row["registered"] = registered_path(region, device, reps, limit, strided=True)
        row["soa_floor"] = soa_floor(view, device, reps, limit)
        row["soa_floor_raw"] = soa_floor(view, device, reps, limit, raw=True)
        return row
    # on the CPU the destination is a contiguous CPU tensor: the naive path and the host copy
    # are the same one copy; the CUDA columns do not exist (n/a)
    row["naive"] = median_us(lambda: torch.from_numpy(view).contiguous(), _no_sync, reps, limit)
    row["host_copy"] = median_us(
        lambda: torch.from_numpy(np.ascontiguousarray(view)), _no_sync, reps, limit
    )
    row["slot_block"] = NA
    row["registered"] = NA
    row["soa_floor"] = NA
    row["soa_floor_raw"] = NA
    return row


def _no_sync() -> None:
    return None


def _register(address: int, size: int) -> None:
    rc = torch.cuda.cudart().cudaHostRegister(address, size, 0)
    if int(rc) != 0:
        raise RuntimeError(f"cudaHostRegister({size} bytes) failed: {rc}")


def _owner(device: Any, span: tuple[int, int], runtime: bool = True) -> Any:
    """What ``transport.torch``'s plans need of their client (the device, the registered span,
    the runtime's copy calls, the copies' event): a ``TorchClient`` without a connection, the
    bench's region standing in for an shm client's."""
    from transport import cudart
    from transport.torch import TorchClient

    owner: Any = object.__new__(TorchClient)
    owner.device, owner.cuda, owner._registered, owner._pending = device, True, span, False
    owner._copied, owner._runtime, owner._event = torch.cuda.Event(), None, 0
    owner._closed = True  # nothing to close: the bench unregisters its own region
    loaded = cudart.load() if runtime else None
    if loaded is not None:
        owner._runtime, owner._event = loaded, loaded.event()
    return owner


def registered_path(
    region: Region, device: Any, reps: int, limit: float, *, strided: bool
) -> float | str:
    """transport.torch's own paths from the registered region: ``strided`` (``_StridedPlan``,
    what a client uses when the CUDA runtime library is found) copies each field of every
    slot's record by one ``cudaMemcpy2DAsync`` into its contiguous tensor; else
    (``_DevicePlan``, the fallback) the block of result records is copied and the field sliced
    on the device (a view), then made contiguous (the table's destination)."""
    from transport.step_view import StepView
    from transport.torch import _DevicePlan, _StridedPlan

    _register(region.address, region.size)
    try:
        owner = _owner(device, (region.address, region.size), runtime=strided)
        view = StepView(region.records)
        if strided:
            if owner._runtime is None:
                return "the CUDA runtime library is not in this process"
            plan: Any = _StridedPlan(owner, view)
        else:
            plan = _DevicePlan(owner, view)
            if plan.stage is not None:
                raise RuntimeError("the device plan did not read the registered region")
        out: list[Any] = []

        def run() -> None:
            step = plan.refresh(owner)  # type: ignore[arg-type]
            out[:] = [step.observation.contiguous()]

        value = median_us(run, torch.cuda.synchronize, reps, limit)
        expected = torch.from_numpy(np.ascontiguousarray(region.view)).to(device)
        if not torch.equal(out[0], expected):
            raise RuntimeError("the registered path's observations differ from the slots'")
        return value
    finally:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaHostUnregister(region.address)


def column_path(region: ColumnRegion, device: Any, reps: int, limit: float) -> float:
    """transport.torch's path over a column-layout region (``_ColumnPlan``): CUDA, the
    registered region's result columns (observation, mask, reward, ...) copied to the device in
    ONE asynchronous copy, the observation a view of it (no slot block, no gather); CPU,
    ``torch.from_numpy`` of the column (no copy at all)."""
    from transport.step_view import StepView
    from transport.torch import _ColumnPlan, _HostPlan

    view = StepView(region.records)  # type: ignore[arg-type]
    if device.type != "cuda":
        plan: Any = _HostPlan(view)
        if plan.copied:
            raise RuntimeError(f"the CPU plan copies {plan.copied}")
        # the client's cached plan per step: its tensors already are the columns (no copy)
        return median_us(lambda: plan.refresh(None).observation, _no_sync, reps, limit)
    _register(region.address, region.size)
    try:
        owner = _owner(device, (region.address, region.size))
        plan = _ColumnPlan(owner, view)
        if any(stage is not None for _, _, stage, _ in plan.copies):
            raise RuntimeError("the column plan did not read the registered region directly")
        out: list[Any] = []

        def run() -> None:
            step = plan.refresh(owner)  # type: ignore[arg-type]
            out[:] = [step.observation]

        value = median_us(run, torch.cuda.synchronize, reps, limit)
        expected = torch.from_numpy(np.ascontiguousarray(region.view)).to(device)
        if not torch.equal(out[0], expected):
            raise RuntimeError("the column path's observations differ from the column's")
        return value
    finally:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaHostUnregister(region.address)


def soa_floor(
    view: np.ndarray, device: Any, reps: int, limit: float, raw: bool = False
) -> float | str:
    """The struct-of-arrays floor: the field of all envs contiguous, registered, one copy
    (``Tensor.copy_``; ``raw``: one ``cudaMemcpyAsync`` of the runtime, no torch dispatch)."""
    soa = mmap.mmap(-1, view.nbytes)
    host = np.ndarray(view.shape, dtype=view.dtype, buffer=soa)
    host[...] = view
    address = host.__array_interface__["data"][0]
    _register(address, view.nbytes)
    try:
        source = torch.from_numpy(host)
        target = torch.empty(view.shape, dtype=source.dtype, device=device)
        if raw:  # the same DMA through the runtime's own call (what the column plan uses)
            from transport import cudart

            runtime = cudart.load()
            if runtime is None:
                return "the CUDA runtime library is not in this process"
            index = torch.device(device).index or 0
            stream = int(torch._C._cuda_getCurrentRawStream(index))
            pointer, nbytes = target.data_ptr(), view.nbytes
            return median_us(
                lambda: runtime.copy(pointer, address, nbytes, stream),
                torch.cuda.synchronize, reps, limit,
            )  # fmt: skip
        return median_us(
            lambda: target.copy_(source, non_blocking=True), torch.cuda.synchronize, reps, limit
        )
    finally:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaHostUnregister(address)


# -- 2. policy -----------------------------------------------------------------------------------


def mlp(device: Any) -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(612, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256), torch.nn.Tanh(),
        torch.nn.Linear(256, 92),
    ).to(device)  # fmt: skip


def masked_sample(net: Any, obs: Any, mask: Any) -> Any:
    """A sample of the masked categorical by the Gumbel-max trick: argmax(logits + Gumbel
    noise) has the softmax's distribution. A handful of kernels and no host sync
    (``torch.distributions.Categorical`` validates its logits with a device-to-host read)."""
    logits = net(obs).masked_fill(~mask, -1e8)
    noise = torch.rand_like(logits).clamp_(min=1e-20).log_().neg_().log_().neg_()
    return (logits + noise).argmax(dim=1)


def policy_table(device: Any, reps: int, budget: Budget) -> list[dict[str, Any]]:
    rows = []
    devices = [torch.device("cpu")] + ([device] if device.type == "cuda" else [])
    for n in (32, 256, 1024):
        row: dict[str, Any] = {"envs": n}
        for dev in devices:
            if budget.left() < 10:
                row[dev.type] = "skipped: time budget"
                continue
            net = mlp(dev)
            obs = torch.rand(n, 612, device=dev)
            mask = torch.rand(n, 92, device=dev) > 0.3

            def run(net: Any = net, obs: Any = obs, mask: Any = mask) -> None:
                with torch.no_grad():
                    masked_sample(net, obs, mask).cpu()

            row[dev.type] = median_us(run, lambda: None, reps, min(5.0, budget.left() / 20))
        if device.type != "cuda":
            row["cuda"] = NA
        rows.append(row)
    return rows


# -- 3. collector --------------------------------------------------------------------------------


def time_round_trips(inner: Any) -> list[float]:
    """Wrap ``inner.step`` (the NumPy client's) to sum its wall seconds into the returned
    one-item list: a collector step minus that is the collector's own work."""
    step = inner.step
    spent = [0.0]

    def timed(actions: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return step(actions, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    inner.step = timed
    return spent


def spawn(env: str, n: int) -> tuple[str, subprocess.Popen[str]]:
    url = f"shm://gpu-bench-{uuid.uuid4().hex[:8]}"
    if env == "tetris":
        server = ROOT / "node_bridge" / "dist" / "examples" / "tetris_server.js"
        if shutil.which("node") is None or not server.is_file():
            raise RuntimeError("skipped: node or node_bridge/dist (npx tsc -p node_bridge) missing")
        command = ["node", str(ROOT / "examples" / "tetris" / "serve.js"), url]
        command += ["--num-envs", str(n), "--seed", "0", "--max-steps", "500"]
    else:
        served = ["--env", env] if env not in SCHEMAS else ["--env", "contract"]
        served += ["--schema", str(SCHEMAS[env])] if env in SCHEMAS else []
        command = [sys.executable, "-m", "transport.tools.serve_cli", url, *served]
        command += ["--num-envs", str(n), "--seed", "0"]
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    line = proc.stdout.readline().strip() if selector.select(30) else ""
    if not line.startswith("ready "):
        proc.kill()
        err = proc.stderr.read() if proc.stderr else ""
        # the Node server is optional on a trainer's machine: a failed start is a skip, said
        why = f"server did not start: {' '.join(command)}: {line!r} {err[-300:]}"
        raise RuntimeError(f"skipped: {why}" if env == "tetris" else why)
    return line.split(" ", 1)[1], proc


SCHEMAS = {"image-columns": ROOT / "schema" / "image_columns.toml"}
"""Collector envs served by the contract env on a schema: Atari-sized u8[3,84,84] observations
in the shm column layout (the contract env writes values derived from its state and actions)."""


def collector_row(
    env: str, n: int, device: Any, seconds: float, graph: bool = False
) -> dict[str, Any]:
    import transport.torch as tt
    from transport.rollout import RolloutCollector

    schema = str(ROOT / "schema" / "tetris.toml") if env == "tetris" else SCHEMAS.get(env)
    url, proc = spawn(env, n)
    try:
        with tt.connect(url, schema, device=device, autoreset="same_step", timeout=60) as client:
            width = int(np.prod(client.reset(0).observation.shape[1:]))
            mask_width = int(client.view["action_mask"].shape[-1])  # type: ignore[index]
            torch.manual_seed(0)
            net = torch.nn.Sequential(
                torch.nn.Linear(width, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256),
                torch.nn.Tanh(), torch.nn.Linear(256, mask_width),
            ).to(client.device)  # fmt: skip

            # the contract env fails a step of its poison action 1 (an ENV_ERROR test): never it
            allowed = torch.ones(mask_width, dtype=torch.bool, device=client.device)
            if env in SCHEMAS:
                allowed[1] = False

            def policy(obs: Any, mask: Any) -> Any:
                return masked_sample(net, obs.flatten(1).float(), mask & allowed)

            spent = time_round_trips(client.client)
            steps = 16
            collector = RolloutCollector(client, policy, steps, seed=0, cuda_graph=graph)
            collector.collect()  # warm-up: allocation, first reset, kernels
            spent[0] = 0.0
            rounds = 0
            start = time.perf_counter()
            while rounds < 2 or time.perf_counter() - start < seconds:
                collector.collect()
                rounds += 1
                if rounds >= 200:
                    break
            if client.device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            lock_steps = rounds * steps
            return {
                "env": env,
                "envs": n,
                "env_steps_per_s": lock_steps * n / elapsed,
                "ms_per_step": elapsed / lock_steps * 1e3,
                "collector_ms_per_step": (elapsed - spent[0]) / lock_steps * 1e3,
                "path": client.path,
                "policy": "CUDA graph" if graph else "eager",
            }
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def collector_table(device: Any, budget: Budget) -> list[dict[str, Any]]:
    rows = []
    graph = device.type == "cuda"  # the policy as one CUDA graph replay (eager beside it once)
    cells = [(env, n, graph) for env in ("echo", "tetris") for n in (32, 256, 1024)]
    cells += [("image-columns", n, graph) for n in (32, 256)]
    if graph:
        cells.insert(2, ("echo", 256, False))
    for k, (env, n, graph) in enumerate(cells):
        if budget.left() < 8:
            rows.append({"env": env, "envs": n, "error": "skipped: time budget"})
            continue
        seconds = max(1.0, min(6.0, (budget.left() - 8) / (len(cells) - k) - 3))
        try:
            rows.append(collector_row(env, n, device, seconds, graph))
        except Exception as exc:  # one cell's failure is printed; the others still run
            rows.append({"env": env, "envs": n, "error": f"{type(exc).__name__}: {exc}"})
            if "skipped" not in str(exc):
                traceback.print_exc()
    return rows


# -- output --------------------------------------------------------------------------------------


def cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"
    return str(value)


def print_table(title: str, columns: list[tuple[str, str]], rows: list[dict[str, Any]]) -> None:
    print(f"\n## {title}\n")
    print("| " + " | ".join(label for _, label in columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for row in rows:
        if "error" in row:
            first = columns[0][0]
            print(f"| {cell(row.get(first, ''))} | {row['error']} |")
            continue
        print("| " + " | ".join(cell(row.get(key, "")) for key, _ in columns) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="auto (default), cpu or cuda[:K]")
    parser.add_argument("--budget", type=float, default=200.0, help="seconds for the whole run")
    parser.add_argument("--reps", type=int, default=200, help="repetitions per transfer cell")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--only", choices=("transfer", "policy", "collector"), action="append", default=None
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            print(f"gpu_bench: --device {args.device}: torch {torch.__version__} sees no CUDA "
                  "device; run with --device cpu", file=sys.stderr)  # fmt: skip
            return 2
    budget = Budget(args.budget)
    started = time.monotonic()
    env = environment(device)
    print("# gpu_bench (issue 25): " + ", ".join(f"{k}={v}" for k, v in env.items()))
    sections = args.only or ["transfer", "policy", "collector"]
    results: dict[str, Any] = {"environment": env}
    failed = False
    us = "us (median per batch)"
    if "transfer" in sections:
        try:
            results["transfer"] = transfer_table(device, args.reps, budget)
            print_table(
                f"Observations to a contiguous {device.type} tensor, {us}",
                [("batch", "batch"), ("naive", "naive: strided view .to"),
                 ("host_copy", "host copy then .to"),
                 ("slot_block", "registered region, slot block, device slice (fallback)"),
                 ("registered", "transport.torch: registered region, one strided copy per field"),
                 ("columns", "column layout: transport.torch, result columns in one copy"),
                 ("soa_floor", "struct-of-arrays registered (floor)"),
                 ("soa_floor_raw", "the floor's bytes, one cudaMemcpyAsync"),
                 ("slot_ratio", "strided / floor"), ("columns_ratio", "columns / floor")],
                results["transfer"],
            )  # fmt: skip
        except Exception:
            failed = True
            traceback.print_exc()
    if "policy" in sections:
        try:
            results["policy"] = policy_table(device, max(3, args.reps // 4), budget)
            print_table(
                f"612-256-256-92 MLP, masks, sampling, actions to the host, {us}",
                [("envs", "envs"), ("cpu", "CPU"), ("cuda", "CUDA")],
                results["policy"],
            )
        except Exception:
            failed = True
            traceback.print_exc()
    if "collector" in sections:
        try:
            results["collector"] = collector_table(device, budget)
            print_table(
                f"RolloutCollector over shm:// on {device}, T=16 per collect",
                [("env", "env"), ("envs", "envs"), ("env_steps_per_s", "env-steps/s"),
                 ("ms_per_step", "ms per lock step"),
                 ("collector_ms_per_step", "transfer + inference ms per step (no round trip)"),
                 ("policy", "policy"), ("path", "path")],
                results["collector"],
            )  # fmt: skip
            failed |= any(
                "error" in row and "skipped" not in row["error"] for row in results["collector"]
            )
        except Exception:
            failed = True
            traceback.print_exc()
    total = time.monotonic() - started
    print(f"\ntotal {total:.1f} s (budget {args.budget:.0f} s)")
    results["seconds"] = total
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
