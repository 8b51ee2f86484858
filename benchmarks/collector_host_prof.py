"""The batched collector's host work per step (issue 25): ``RolloutCollector.collect`` time
minus the client's own round trips (``Client.step``: the server's stepping), per lock step,
as ``benchmarks/gpu_bench.py`` measures "transfer + inference", here on the CPU, N = 256.

The policy is the cheapest legal one (the first legal action: two small kernels), so what is
left is the collector's and ``TorchClient``'s own work: observation and mask copies into the
buffer, actions back, rewards and flags, finals, episode returns.

- ``--ab OLD/transport/rollout.py``: the old collector (another tree's file, loaded beside
  this one) and this tree's on ONE client, offline (below), collect by collect in A B B A
  order, then ``_ends`` (a step's rewards, flags and 10 finals) and ``_episodes`` best of 7:
  the figure to compare on a shared, loaded machine.
- ``--offline``: after the warm-up every step returns one real step's result (tetris: and 10
  of its finals) without asking the server: no server competes for the cores.
- ``--finals-stage``: also times the CUDA branch's finals work for 10 finals (stacked into
  the stage, one copy to a fresh block, the TensorSteps) on the CPU with event stand-ins.
- Without ``--ab``, run it with ``PYTHONPATH`` at each tree, alternating::

    for i in 1 2 3; do for tree in /tmp/old /work/main; do
      PYTHONPATH=$tree python benchmarks/collector_host_prof.py --env tetris --offline; done; done

Prints one JSON line (microseconds per step: median, quartiles, 10th percentile).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import timeit
from pathlib import Path
from typing import Any

import numpy as np
import torch

import transport  # before gpu_bench, which puts its own tree first on sys.path (PYTHONPATH wins)
import transport.rollout
import transport.torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_bench  # noqa: E402


class _FakeEvent:
    """Orders nothing: the CPU copies are done when queued."""

    def record(self, *args: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _FakeCuda:
    Event = _FakeEvent

    @staticmethod
    def current_stream(*args: Any) -> None:
        return None


def run(
    env: str, n: int, steps: int, collects: int, stage: bool, cprofile: bool, offline: bool
) -> dict[str, Any]:
    import transport.rollout as rollout
    import transport.torch as tt
    from transport.rollout import RolloutCollector

    torch.set_num_threads(1)
    schema = str(gpu_bench.ROOT / "schema" / "tetris.toml") if env == "tetris" else None
    url, proc = gpu_bench.spawn(env, n)
    try:
        with tt.connect(url, schema, device="cpu", autoreset="same_step", timeout=60) as client:

            def policy(obs: Any, mask: Any) -> Any:
                return mask.to(torch.uint8).argmax(dim=1)

            inner = client.client
            # (thread_time is a ~100 us system call here: wall time only)
            spent = gpu_bench.time_round_trips(inner)
            collector = RolloutCollector(client, policy, steps, seed=0)
            collector.collect()  # warm-up
            if offline:
                _replay_one_step(inner, collector, finals=10 if env == "tetris" else 0)
            per_step: list[float] = []
            finals = 0
            profile: Any = None
            if cprofile:
                import cProfile

                profile = cProfile.Profile()
                profile.enable()
            for _ in range(collects):
                spent[0] = 0.0
                start = time.perf_counter()
                buf = collector.collect()
                elapsed = time.perf_counter() - start
                per_step.append((elapsed - spent[0]) / steps * 1e6)
                finals += len(buf.finals)
            if profile is not None:
                import pstats

                profile.disable()
                pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(25)
            quartiles = statistics.quantiles(per_step, n=4)
            tenth = statistics.quantiles(per_step, n=10)[0]
            out: dict[str, Any] = {
                "tree": str(Path(transport.__file__).parents[1]),
                "env": env,
                "envs": n,
                "offline": offline,
                "collects": collects,
                "host_us_per_step_median": round(statistics.median(per_step), 1),
                "q1": round(quartiles[0], 1),
                "q3": round(quartiles[2], 1),
                "p10": round(tenth, 1),
                "finals_per_step": round(finals / (collects * steps), 2),
            }
            if stage:
                out["stage_finals_us"] = _stage_cost(collector, rollout)
            return out
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:
            proc.kill()


def run_ab(env: str, n: int, steps: int, rounds: int, old_path: str) -> dict[str, Any]:
    """Old and new ``RolloutCollector`` (``old_path``: another tree's ``transport/rollout.py``,
    loaded beside this one) on ONE client, offline (``_replay_one_step``), alternating collect
    by collect: the machine's load falls on both alike. Both use this tree's ``transport.torch``
    (on the CPU its step path is the same code in both trees)."""
    import importlib.util

    import transport.rollout as new_rollout
    import transport.torch as tt

    spec = importlib.util.spec_from_file_location("old_rollout", old_path)
    assert spec is not None and spec.loader is not None
    old_rollout = importlib.util.module_from_spec(spec)
    sys.modules["old_rollout"] = old_rollout  # its dataclass looks itself up there
    spec.loader.exec_module(old_rollout)
    torch.set_num_threads(1)
    schema = str(gpu_bench.ROOT / "schema" / "tetris.toml") if env == "tetris" else None
    url, proc = gpu_bench.spawn(env, n)
    try:
        with tt.connect(url, schema, device="cpu", autoreset="same_step", timeout=60) as client:

            def policy(obs: Any, mask: Any) -> Any:
                return mask.to(torch.uint8).argmax(dim=1)

            made = {
                "old": old_rollout.RolloutCollector(client, policy, steps, seed=0),
                "new": new_rollout.RolloutCollector(client, policy, steps, seed=0),
            }
            for collector in made.values():
                collector.collect()  # warm-up (and the first reset)
            _replay_one_step(client.client, made["new"], finals=10 if env == "tetris" else 0)
            times: dict[str, list[float]] = {name: [] for name in made}
            order = list(made.items())
            for _ in range(rounds):
                order.reverse()  # A B B A A B ...: neither always runs first
                for name, collector in order:
                    start = time.perf_counter()
                    collector.collect()
                    times[name].append((time.perf_counter() - start) / steps * 1e6)
            out: dict[str, Any] = {"env": env, "envs": n, "rounds": rounds, "steps": steps}
            for name, values in times.items():
                out[f"{name}_us_per_step_median"] = round(statistics.median(values), 1)
                out[f"{name}_p10"] = round(statistics.quantiles(values, n=10)[0], 1)
            # the parts, best of 7 alternating runs each: the step's rewards, flags and finals
            # (10 of them for tetris) and the rollout's episode returns (per collect)
            parts: dict[str, dict[str, list[float]]] = {"ends": {}, "episodes": {}}
            for _ in range(7):
                for name, collector in made.items():
                    buf = collector.buffer

                    def ends(c: Any = collector, b: Any = buf) -> None:
                        b.finals.clear()
                        c._ends(b, 3)

                    def episodes(c: Any = collector, b: Any = buf) -> None:
                        c._episodes(b)

                    for part, fn, number in (("ends", ends, 1000), ("episodes", episodes, 50)):
                        took = timeit.timeit(fn, number=number) / number * 1e6
                        parts[part].setdefault(name, []).append(took)
            for part, by_name in parts.items():
                for name, values in by_name.items():
                    out[f"{name}_{part}_us"] = round(min(values), 1)
            return out
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:
            proc.kill()


def _replay_one_step(inner: Any, collector: Any, finals: int) -> None:
    """From now on the client's step returns one real step's result and ``finals`` of its
    final results (the server is not asked): what is left is the host work per step."""
    step = inner.step
    last = collector._last
    while True:
        view = step(last[collector.mask_name].to(torch.uint8).argmax(dim=1).numpy())
        kept = list(inner.finals)
        if len(kept) >= finals:
            break
    kept = kept[:finals]

    def replayed(actions: Any, **kwargs: Any) -> Any:
        inner.finals = kept
        return view

    inner.step = replayed


def _stage_cost(collector: Any, rollout: Any) -> float:
    """Median microseconds of the CUDA branch's finals work for 10 final results (their
    records stacked and staged, one copy to a fresh block, the 10 TensorSteps), on the host:
    the device a CPU one, the events stand-ins."""
    from transport.step_view import StepView
    from transport.torch import TensorStep

    view = collector.client.view
    finals = [(i, StepView(view.record[i])) for i in range(0, 250, 25)]
    real = rollout._cuda
    rollout._cuda = _FakeCuda()
    new = hasattr(collector, "_stack_finals")
    if new:
        collector._staged = True
        collector.client._mark_copied = lambda stream: None
    try:
        times = []
        for _ in range(300):
            start = time.perf_counter()
            if new:
                records = collector._final_records(finals[0][1].record.dtype, len(finals))
                for k, (_, final) in enumerate(finals):
                    records[k] = final.record
                stacked = collector._stack_finals(records)
            else:
                first = finals[0][1].record
                records = np.array([final.record for _, final in finals], dtype=first.dtype)
                stacked = collector._stage_finals(records)
            steps = [TensorStep(rollout._FinalRow(stacked, k)) for k in range(len(finals))]
            times.append((time.perf_counter() - start) * 1e6)
        assert len(steps) == len(finals)
        return round(statistics.median(times), 1)
    finally:
        rollout._cuda = real


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="tetris", help="tetris (Node server) or echo")
    parser.add_argument("--envs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=16, help="lock steps per collect")
    parser.add_argument("--collects", type=int, default=40)
    parser.add_argument("--finals-stage", action="store_true", help="time _stage_finals too")
    parser.add_argument("--profile", action="store_true", help="cProfile to stderr")
    parser.add_argument(
        "--offline",
        action="store_true",
        help="after the warm-up, every step returns one real step's result (tetris: and 10 of "
        "its finals) without asking the server: the host work alone, no server competing",
    )
    parser.add_argument(
        "--ab", metavar="OLD_ROLLOUT_PY", help="old vs this tree's collector, in one process"
    )
    args = parser.parse_args()
    if args.ab:
        print(json.dumps(run_ab(args.env, args.envs, args.steps, args.collects, args.ab)))
        return 0
    result = run(
        args.env,
        args.envs,
        args.steps,
        args.collects,
        args.finals_stage,
        args.profile,
        args.offline,
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
