"""In-process micro-benchmark of the Python shm server's per-step work (no client process).

  PYTHONPATH=TREE python benchmarks/shm_server_step_micro.py [--envs 1] [--steps 20000]
      [--repeat 9]

Creates an shm:// region served by ``Listener`` (echo env, pac_env schema, ``--envs`` envs),
takes the lease for this process and then plays the client in the same thread: write the actions
and the STEP command into the slots, bump their request words, call ``Listener._serve_batch``
once. Prints the best of ``--repeat`` runs in ns per step: the client's writes alone, and with
``_serve_batch``; their difference is the server's Python work per step of a batch (what a
probe round trip adds on top of the futex wake-ups). Runs on this tree and on trees back to
296e6f6 (both Listener module layouts), so two commits can be compared in one sitting
(PYTHONPATH picks the tree).
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit
from typing import Any


def started_listener(url: str, num_envs: int = 1) -> Any:
    """A started Listener of the tree on sys.path (the runtime layout, else 296e6f6's)."""
    from transport.envs import env_factory
    from transport.generated import pac_env

    try:
        from transport.backends.shm.server import Listener
        from transport.runtime.host import EnvHost
    except ImportError:  # 296e6f6: transport.backends.shm is one module, sessions in server.py
        from transport.server import SessionFactory  # type: ignore[import-not-found]

        from transport.backends.shm import Listener

        sessions = SessionFactory(pac_env.SCHEMA, env_factory("echo"), num_envs=num_envs)
        listener = Listener(url, sessions)
    else:
        host = EnvHost(pac_env.SCHEMA, env_factory("echo"), num_envs=num_envs, env_name="echo")
        host.check()
        listener = Listener(url, host)
    listener.start()
    return listener


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=1, help="envs stepped per batch")
    parser.add_argument("--steps", type=int, default=20000, help="steps per timed run")
    parser.add_argument("--repeat", type=int, default=9, help="timed runs (the best is kept)")
    args = parser.parse_args()
    n = args.envs
    listener = started_listener(f"shm://step-micro-{os.getpid()}", n)
    try:
        slot_command = sys.modules[type(listener).__module__].SlotCommand
        region = listener.region
        region.set("client_pid", os.getpid())  # this process holds the lease
        request_word = region.strided("sem_action_ready")
        command = region.strided("command")
        action = region.strided("action")
        status = region.strided("status")
        serve_batch = listener._serve_batch
        sequence = [0]

        def send(cmd: int, value: int) -> None:
            command[:n] = cmd
            action[:n] = value
            sequence[0] += 1
            request_word[:n] = sequence[0]

        send(int(slot_command.RESET), 0)
        serve_batch()
        assert not status[:n].any(), "the reset was refused"
        step = int(slot_command.STEP)

        def client_part() -> None:
            send(step, 5)

        def round_trip() -> None:
            send(step, 5)
            serve_batch()

        timings = {}
        for name, fn in (("client writes", client_part), ("client + _serve_batch", round_trip)):
            best = min(timeit.repeat(fn, number=args.steps, repeat=args.repeat))
            timings[name] = best / args.steps * 1e9
        round_trip()
        assert not status[:n].any(), "the step was refused"
        timings["_serve_batch"] = timings["client + _serve_batch"] - timings["client writes"]
        for name, ns in timings.items():
            print(f"{name:24s} {ns:7.0f} ns")
    finally:
        listener.close()


if __name__ == "__main__":
    main()
