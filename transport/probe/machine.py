"""The machine the numbers were measured on: CPU, cores, affinity, kernel, /dev/shm, versions."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def cpu_model() -> str:
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Hardware", "Processor", "cpu model"):
            return value.strip()
    return platform.processor() or platform.machine()


def _ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    spans: list[list[int]] = []
    for cpu in sorted(cpus):
        if spans and spans[-1][1] == cpu - 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _command_version(command: list[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _module_version(name: str) -> str | None:
    try:
        module = __import__(name)
    except Exception:
        return None
    return str(getattr(module, "__version__", "unknown"))


def _libzmq() -> str | None:
    try:
        import zmq
    except Exception:
        return None
    return str(zmq.zmq_version())


def _git_commit() -> str | None:
    """The commit of the checkout this package runs from; None for an installed package (it
    may sit inside another project's repository: that repository's commit is not ours)."""
    top = _command_version(["git", "-C", str(ROOT), "rev-parse", "--show-toplevel"])
    if top is None or Path(top).resolve() != ROOT or not (ROOT / "transport").is_dir():
        return None
    commit = _command_version(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"])
    if commit is None:
        return None
    dirty = _command_version(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked=no"])
    return commit + ("+dirty" if dirty else "")


def shm_size() -> dict[str, int] | None:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return {"total_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize}


def machine_info() -> dict[str, Any]:
    """Everything recorded with the numbers (JSON-ready)."""
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    uname = platform.uname()
    governor = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    return {
        "hostname": uname.node,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity": _ranges(affinity),
        "affinity_count": len(affinity),
        "pinning": (
            "none: the probe, its servers and the floor's two processes run on the CPUs of the "
            "affinity mask and the scheduler places them"
        ),
        "cpu_governor": governor,
        "kernel": f"{uname.system} {uname.release}",
        "kernel_version": uname.version,
        "arch": uname.machine,
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "dev_shm": shm_size(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "node": _command_version(["node", "--version"]),
        "pyzmq": _module_version("zmq"),
        "libzmq": _libzmq(),
        "numpy": _module_version("numpy"),
        "cffi": _module_version("cffi"),
        "matplotlib": _module_version("matplotlib"),
        "transport_commit": _git_commit(),
    }


def summary(info: dict[str, Any]) -> str:
    """One line for the table header and RESULTS.md."""
    shm = info.get("dev_shm") or {}
    shm_text = f"{shm['total_bytes'] / 2**30:.1f} GiB" if shm else "n/a"
    load = f"{info['loadavg'][0]:.2f}" if info.get("loadavg") else "n/a"
    return (
        f"{info['cpu_model']}, {info['cpu_count']} CPUs (affinity {info['affinity']}), "
        f"{info['kernel']}, /dev/shm {shm_text}, load {load}; Python {info['python']}, "
        f"Node {info['node'] or 'n/a'}, pyzmq {info['pyzmq'] or 'n/a'} / libzmq "
        f"{info['libzmq'] or 'n/a'}, numpy {info['numpy']}"
    )
