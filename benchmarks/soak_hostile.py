"""Soak: hostile and well-behaved clients together against real servers (issue 17 item 1).

    python benchmarks/soak_hostile.py [--duration 600] [--targets unix:python,unix:node,http:python]
                                      [--json out.json]

Outside CI. For each target (scheme:server language) it starts ``transport-serve URL --env
contract --schema pac_env`` with small limits (--max-connections 256 --idle-timeout 10
--read-timeout 5, so that every limit trips many times in a run), connects two well-behaved
clients that reset and step without pause for the whole run, and lets hostile clients loose
alongside them:

- huge: declares a 1-60 MiB body, sends 10 bytes of it, holds 0-1 s, closes;
- slowloris: trickles a request one byte every 0.5 s until the server cuts it (read timeout);
- flood: opens 300 connections at once (the cap is 256: the excess must be refused with an
  answer), holds 1 s, closes;
- garbage: sends 4-64 KiB of random bytes, reads what comes back, closes;
- idle: keeps 20 connections that never send a byte (closed by the idle timeout), reopens them.

Every 5 s it samples each server's RSS (/proc/PID/status). It passes when every well-behaved
step was answered (no error at all) and each server's memory is flat: the median RSS of the last
minute is within ``--rss-slack`` MiB (default 50) of the median of the second minute (the first
is warm-up). Exit status 0 on a pass, 1 otherwise; the summary is printed (and written as JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import transport
from transport.testing import ServeProcess, unique_url
from transport.testing.checks_limits import declare_body, raw_connect, rss_mib

MIB = 1 << 20
LIMITS = ("--max-connections", "256", "--idle-timeout", "10", "--read-timeout", "5")
FLOOD = 300
"""Connections a flood opens at once: more than --max-connections."""
SAMPLE_EVERY = 5.0


@dataclass
class Target:
    """One server under soak and what happened to it."""

    scheme: str
    lang: str
    server: ServeProcess | None = None
    steps: int = 0
    step_errors: list[str] = field(default_factory=list)
    hostile: dict[str, int] = field(default_factory=dict)
    rss: list[tuple[float, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return f"{self.scheme}:{self.lang}"

    def count(self, what: str) -> None:
        with self.lock:
            self.hostile[what] = self.hostile.get(what, 0) + 1


PACE = 0.001
"""Seconds a well-behaved client rests between steps (the machine is shared: no busy loop)."""


def well_behaved(target: Target, stop: threading.Event, seed: int) -> None:
    """Reset, then step (action 0, always allowed by the contract env; the server resets
    ended episodes: same_step) until the end; every answer is counted."""
    assert target.server is not None
    try:
        client = transport.connect(target.server.url, timeout=30, autoreset="same_step")
    except Exception as exc:
        target.step_errors.append(f"connect: {type(exc).__name__}: {exc}")
        return
    with client:
        try:
            client.reset(seed)
            while not stop.is_set():
                client.step([0] * client.num_envs)
                with target.lock:
                    target.steps += 1
                time.sleep(PACE)
        except Exception as exc:
            target.step_errors.append(f"step: {type(exc).__name__}: {exc}")


def _close(sock: socket.socket | None) -> None:
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass


def huge(target: Target, stop: threading.Event, rng: random.Random) -> None:
    assert target.server is not None
    while not stop.is_set():
        sock = None
        try:
            sock = raw_connect(target.server.url, timeout=5)
            sock.sendall(declare_body(target.server.url, rng.randint(1, 60) * MIB)[:10])
            time.sleep(rng.random())
            target.count("huge")
        except OSError:
            target.count("huge-refused")
        finally:
            _close(sock)


def slowloris(target: Target, stop: threading.Event, rng: random.Random) -> None:
    assert target.server is not None
    while not stop.is_set():
        sock = None
        try:
            sock = raw_connect(target.server.url, timeout=5)
            data = declare_body(target.server.url, 4096) + b"z" * 4096
            for byte in data:
                if stop.is_set():
                    break
                sock.send(bytes([byte]))
                time.sleep(0.5)
            if not stop.is_set():
                target.count("slowloris-uncut")
        except OSError:
            target.count("slowloris-cut")
        finally:
            _close(sock)


def flood(target: Target, stop: threading.Event, rng: random.Random) -> None:
    """Open FLOOD connections at once (more than the cap): those over it must be refused with
    an answer (ERROR frame / 503) and closed; hold the rest 1 s, close them all."""
    assert target.server is not None
    while not stop.is_set():
        socks: list[socket.socket] = []
        try:
            for _ in range(FLOOD):
                socks.append(raw_connect(target.server.url, timeout=5))
        except OSError:
            target.count("flood-connect-failed")
        stop.wait(1.0)
        for sock in socks:
            try:
                answered = bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
            except BlockingIOError:
                answered = False
            except OSError:
                answered = True
            target.count("flood-refused" if answered else "flood-admitted")
            _close(sock)
        stop.wait(rng.random())


def garbage(target: Target, stop: threading.Event, rng: random.Random) -> None:
    assert target.server is not None
    while not stop.is_set():
        sock = None
        try:
            sock = raw_connect(target.server.url, timeout=5)
            sock.sendall(rng.randbytes(rng.randint(4096, 65536)))
            sock.settimeout(2)
            while sock.recv(65536):
                pass
            target.count("garbage")
        except OSError:
            target.count("garbage-reset")
        finally:
            _close(sock)
        stop.wait(0.05)


def idle(target: Target, stop: threading.Event, rng: random.Random) -> None:
    assert target.server is not None
    socks: list[socket.socket] = []
    while not stop.is_set():
        alive = []
        for sock in socks:
            try:
                closed = sock.recv(1, socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                closed = False
            except OSError:
                closed = True
            if closed:
                target.count("idle-closed")
                _close(sock)
            else:
                alive.append(sock)
        socks = alive
        while len(socks) < 20 and not stop.is_set():
            try:
                socks.append(raw_connect(target.server.url, timeout=5))
            except OSError:
                target.count("idle-refused")
                break
        stop.wait(1.0)
    for sock in socks:
        _close(sock)


HOSTILE = {"huge": huge, "slowloris": slowloris, "flood": flood, "garbage": garbage, "idle": idle}


def sampler(targets: list[Target], stop: threading.Event, started: float) -> None:
    while not stop.wait(SAMPLE_EVERY):
        for target in targets:
            assert target.server is not None
            try:
                target.rss.append((time.monotonic() - started, rss_mib(target.server.pid)))
            except (OSError, AssertionError):
                target.step_errors.append("the server process is gone")


def verdict(target: Target, duration: float, slack: float) -> dict[str, Any]:
    """The summary of one target and whether it passed."""
    early = [rss for t, rss in target.rss if 60 <= t < 120] or [rss for _, rss in target.rss[:3]]
    late = [rss for t, rss in target.rss if t >= duration - 60] or [
        rss for _, rss in target.rss[-3:]
    ]
    early_mib = statistics.median(early) if early else float("nan")
    late_mib = statistics.median(late) if late else float("nan")
    flat = bool(early and late and late_mib - early_mib <= slack)
    return {
        "target": target.name,
        "steps": target.steps,
        "step_errors": target.step_errors,
        "hostile": dict(sorted(target.hostile.items())),
        "rss_first_mib": target.rss[0][1] if target.rss else None,
        "rss_max_mib": max((rss for _, rss in target.rss), default=None),
        "rss_minute2_median_mib": round(early_mib, 1),
        "rss_last_minute_median_mib": round(late_mib, 1),
        "flat": flat,
        "passed": flat and not target.step_errors and target.steps > 0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--targets", default="unix:python,unix:node,http:python")
    parser.add_argument("--rss-slack", type=float, default=50.0, help="MiB (default 50)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args()
    targets = [Target(*spec.split(":")) for spec in args.targets.split(",")]
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        for target in targets:
            target.server = ServeProcess(
                unique_url(target.scheme),
                "pac_env",
                lang=target.lang,
                max_body=64 * MIB,
                extra_args=LIMITS,
            )
        started = time.monotonic()
        rng = random.Random(args.seed)
        for i, target in enumerate(targets):
            for k in range(2):
                seed = 100 * i + k
                threads.append(threading.Thread(target=well_behaved, args=(target, stop, seed)))
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # the well-behaved clients are in before the hostile ones
        for target in targets:
            for run in HOSTILE.values():
                hostile_rng = random.Random(rng.random())
                thread = threading.Thread(target=run, args=(target, stop, hostile_rng), daemon=True)
                thread.start()
                threads.append(thread)
        watcher = threading.Thread(target=sampler, args=(targets, stop, started), daemon=True)
        watcher.start()
        while time.monotonic() - started < args.duration:
            time.sleep(min(30.0, args.duration))
            elapsed = time.monotonic() - started
            line = ", ".join(
                f"{t.name} {t.steps} steps {len(t.step_errors)} errors "
                f"{t.rss[-1][1] if t.rss else 0:.0f} MiB"
                for t in targets
            )
            print(f"[{elapsed:5.0f} s] {line}", flush=True)
        stop.set()
        for thread in threads:
            thread.join(timeout=15)
    finally:
        stop.set()
        for target in targets:
            if target.server is not None:
                target.server.stop()
    summary = {
        "duration_s": args.duration,
        "limits": " ".join(LIMITS),
        "machine": f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}",
        "targets": [verdict(t, args.duration, args.rss_slack) for t in targets],
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0 if all(t["passed"] for t in summary["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
