"""zmq+tcp across hosts: servers and client in separate network namespaces joined by a veth pair.

The servers run in one namespace (10.200.N.1), the client in another (10.200.N.2); nothing else
is addressed. tc shapes the link: a slow egress (tbf) makes replies late (TransportTimeoutError,
then the client goes on: the late replies are dropped by msg_id), a link taken down stops the
heartbeats (PeerGoneError well before the request timeout) and, once it is up again, ZeroMQ
reconnects with the same routing id and the same server session continues. Packet loss: tbf with a
one-packet queue drops the tail of every reply burst (TCP retransmits it: steps succeed, late;
a shorter timeout is TransportTimeoutError and the client goes on). netem delay and loss run
too where the kernel has sch_netem. Skipped only where namespaces cannot be made (not root,
no iproute2, no CAP_NET_ADMIN).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from .servers import ROOT

CLIENT = r"""
import json, subprocess, sys, time
import numpy as np
import transport
from transport.errors import PeerGoneError, TransportTimeoutError
from transport.multi import BatchError

spec = json.loads(sys.argv[1])
out = {}

def sh(*cmd):
    subprocess.run(list(cmd), check=True, capture_output=True)

def step_all(multi, action):
    return multi.step([action] * multi.num_envs)

multi = transport.connect_many(spec["urls"], timeout=5)
multi.reset()
r = step_all(multi, 1)
out["envs"] = multi.num_envs
out["first"] = r.observation[:, :2].tolist()

if spec["phase"] == "shaping":
    # a slow server egress: each reply needs ~0.3 s to leave, the client waits 0.1 s
    sh("ip", "netns", "exec", spec["server_ns"], "tc", "qdisc", "add", "dev", spec["server_if"],
       "root", "tbf", "rate", "64kbit", "burst", "1600", "latency", "10s")
    multi.timeout = 0.1
    t = time.monotonic()
    try:
        step_all(multi, 2)
        out["slow"] = "no error"
    except BatchError as exc:
        out["slow"] = sorted({type(f.error).__name__ for f in exc.failures})
        out["slow_env_ids"] = exc.env_ids
    out["slow_elapsed"] = time.monotonic() - t
    sh("ip", "netns", "exec", spec["server_ns"], "tc", "qdisc", "del", "dev", spec["server_if"],
       "root")
    multi.timeout = 5
    r = step_all(multi, 3)  # the late replies to action 2 arrive first and are discarded
    out["after_slow"] = r.observation[:, :2].tolist()

    # the link goes down: heartbeats stop, the batch fails long before its 5 s timeout
    sh("ip", "link", "set", "dev", spec["client_if"], "down")
    t = time.monotonic()
    try:
        step_all(multi, 4)
        out["down"] = "no error"
    except BatchError as exc:
        out["down"] = sorted({type(f.error).__name__ for f in exc.failures})
    out["down_elapsed"] = time.monotonic() - t
    sh("ip", "link", "set", "dev", spec["client_if"], "up")
    # retry until ZeroMQ has reconnected; the sessions (and their step counts) survive
    retries = 0
    deadline = time.monotonic() + 20
    while True:
        try:
            r = step_all(multi, 5)
            break
        except BatchError:
            retries += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    out["retries"] = retries
    out["after_up"] = r.observation[:, :2].tolist()

if spec["phase"] == "netem":
    sh("tc", "qdisc", "add", "dev", spec["client_if"], "root", "netem", "delay", "40ms",
       "loss", "10%")
    sh("ip", "netns", "exec", spec["server_ns"], "tc", "qdisc", "add", "dev", spec["server_if"],
       "root", "netem", "delay", "40ms", "loss", "10%")
    t = time.monotonic()
    ok = 0
    for action in range(2, 32):
        r = step_all(multi, action)  # TCP retransmits what netem drops: every step succeeds
        ok += bool((r.observation[:, 0] == action).all())
    out["netem_ok"] = ok
    out["netem_per_step"] = (time.monotonic() - t) / 30
    multi.timeout = 0.05  # below the 80 ms round trip: a timeout, then the client goes on
    try:
        step_all(multi, 40)
        out["netem_timeout"] = "no error"
    except BatchError as exc:
        out["netem_timeout"] = sorted({type(f.error).__name__ for f in exc.failures})
    multi.timeout = 10
    r = step_all(multi, 41)
    out["netem_after"] = r.observation[:, :2].tolist()

if spec["phase"] == "loss":
    # without sch_netem: a token bucket on the server's egress whose queue holds one packet, so
    # the rest of each multi-packet reply burst is dropped and TCP has to retransmit it
    sh("ip", "netns", "exec", spec["server_ns"], "tc", "qdisc", "add", "dev", spec["server_if"],
       "root", "tbf", "rate", "4mbit", "burst", "1600", "limit", "1600")
    t = time.monotonic()
    ok = 0
    for action in range(2, 17):
        r = step_all(multi, action)  # every step succeeds, late but whole and in order
        ok += bool((r.observation[:, 0] == action).all())
    out["loss_ok"] = ok
    out["loss_per_step"] = (time.monotonic() - t) / 15
    stats = subprocess.run(
        ["ip", "netns", "exec", spec["server_ns"], "tc", "-s", "qdisc", "show", "dev",
         spec["server_if"]], capture_output=True, text=True, check=True).stdout
    out["loss_dropped"] = int(stats.split("dropped ")[1].split(",")[0])
    multi.timeout = 0.002  # shorter than a retransmission: a timeout, then the client goes on
    try:
        for action in range(20, 40):
            step_all(multi, action)
        out["loss_timeout"] = "no error"
    except BatchError as exc:
        out["loss_timeout"] = sorted({type(f.error).__name__ for f in exc.failures})
    sh("ip", "netns", "exec", spec["server_ns"], "tc", "qdisc", "del", "dev", spec["server_if"],
       "root")
    multi.timeout = 10
    r = step_all(multi, 41)
    out["loss_after"] = r.observation[:, :2].tolist()

multi.close()
print(json.dumps(out))
"""


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)


@dataclass
class Net:
    server_ns: str
    client_ns: str
    server_if: str
    client_if: str
    server_ip: str
    client_ip: str


def _make_net() -> Net:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("iproute2 (ip, tc) is not installed")
    tag = uuid.uuid4().hex[:6]
    subnet = random.randint(1, 250)
    net = Net(
        f"tzs-{tag}",
        f"tzc-{tag}",
        f"tzs{tag}",
        f"tzc{tag}",
        f"10.200.{subnet}.1",
        f"10.200.{subnet}.2",
    )
    probe = _run("ip", "netns", "add", net.server_ns)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {probe.stderr.strip()}")
    steps = [
        ("ip", "netns", "add", net.client_ns),
        ("ip", "link", "add", net.server_if, "type", "veth", "peer", "name", net.client_if),
        ("ip", "link", "set", net.server_if, "netns", net.server_ns),
        ("ip", "link", "set", net.client_if, "netns", net.client_ns),
    ]
    for ns, dev, ip in (
        (net.server_ns, net.server_if, net.server_ip),
        (net.client_ns, net.client_if, net.client_ip),
    ):
        steps += [
            ("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"),
            ("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/24", "dev", dev),
            ("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up"),
        ]
    for step in steps:
        done = _run(*step)
        if done.returncode != 0:
            _drop_net(net)
            pytest.skip(f"cannot set up the namespaces ({' '.join(step)}): {done.stderr.strip()}")
    return net


def _drop_net(net: Net) -> None:
    for ns in (net.server_ns, net.client_ns):
        _run("ip", "netns", "del", ns)  # takes the veth end inside it along


class NsServer:
    """transport-serve inside the server namespace."""

    def __init__(self, net: Net, port: int) -> None:
        url = f"zmq+tcp://{net.server_ip}:{port}?allow_insecure=1&heartbeat=0.2"
        command = [sys.executable, "-m", "transport.tools.serve_cli", url, "--env", "echo"]
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", net.server_ns, *command, "--num-envs", "2"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("ready "):
            self.stop()
            raise RuntimeError(f"server in {net.server_ns} did not start: {line!r}")
        self.url = line.split(" ", 1)[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture(scope="module")
def net() -> Iterator[tuple[Net, list[str]]]:
    network = _make_net()
    servers: list[NsServer] = []
    try:
        for port in (5601, 5602):
            servers.append(NsServer(network, port))
        yield network, [server.url for server in servers]
    finally:
        for server in servers:
            server.stop()
        _drop_net(network)


def _client(net: Net, urls: list[str], phase: str) -> dict[str, Any]:
    spec = {
        "urls": urls,
        "phase": phase,
        "server_ns": net.server_ns,
        "server_if": net.server_if,
        "client_if": net.client_if,
    }
    done = subprocess.run(
        ["ip", "netns", "exec", net.client_ns, sys.executable, "-c", CLIENT, json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_tcp_between_namespaces_timeouts_disconnects_and_reconnects(
    net: tuple[Net, list[str]],
) -> None:
    network, urls = net
    assert all(network.server_ip in url for url in urls)
    out = _client(network, urls, "shaping")
    assert out["envs"] == 4
    assert out["first"] == [[1.0, 1.0]] * 4
    # a slow link: both servers' replies are late -> TransportTimeoutError, per env id
    assert out["slow"] == ["TransportTimeoutError"], out
    assert out["slow_env_ids"] == [0, 1, 2, 3]
    # the client goes on; the late replies were discarded; the servers did step (count 3)
    assert out["after_slow"] == [[3.0, 3.0]] * 4
    # link down: heartbeats stop -> PeerGoneError in about 3 x 0.2 s, not the 5 s timeout
    assert out["down"] == ["PeerGoneError"], out
    assert out["down_elapsed"] < 4.0
    # link up: reconnected with the same routing id, the same sessions continue
    assert out["after_up"][0][0] == 5.0
    assert all(row[0] == 5.0 and row[1] >= 4.0 for row in out["after_up"]), out


def test_netem_delay_and_loss(net: tuple[Net, list[str]]) -> None:
    network, urls = net
    check = _run(
        "ip", "netns", "exec", network.client_ns, "tc", "qdisc", "add", "dev", "lo", "root",
        "netem", "delay", "1ms",
    )  # fmt: skip
    if check.returncode != 0:
        pytest.skip(f"tc netem is not available in this kernel: {check.stderr.strip()}")
    _run("ip", "netns", "exec", network.client_ns, "tc", "qdisc", "del", "dev", "lo", "root")
    try:
        out = _client(network, urls, "netem")
    finally:
        _run("ip", "netns", "exec", network.client_ns, "tc", "qdisc", "del", "dev",
             network.client_if, "root")  # fmt: skip
        _run("ip", "netns", "exec", network.server_ns, "tc", "qdisc", "del", "dev",
             network.server_if, "root")  # fmt: skip
    assert out["netem_ok"] == 30
    assert out["netem_timeout"] == ["TransportTimeoutError"]
    assert all(row[0] == 41.0 for row in out["netem_after"])


def test_packet_loss_is_retransmitted_and_timeouts_leave_the_client_usable(
    net: tuple[Net, list[str]],
) -> None:
    """Loss without sch_netem (this kernel has none): tbf with a one-packet queue drops the
    tail of every multi-packet reply; TCP retransmits it, so steps succeed, only later."""
    network, urls = net
    try:
        out = _client(network, urls, "loss")
    finally:
        _run("ip", "netns", "exec", network.server_ns, "tc", "qdisc", "del", "dev",
             network.server_if, "root")  # fmt: skip
    assert out["loss_dropped"] > 0, out  # packets were really dropped
    assert out["loss_ok"] == 15, out
    assert out["loss_timeout"] == ["TransportTimeoutError"], out
    # the late replies were discarded by msg_id; the sessions go on with the next action
    assert all(row[0] == 41.0 for row in out["loss_after"]), out
