"""transport-probe misused: a URL that is not one, flags that do not apply with --url, a --gym
server whose action space is not Discrete/MultiDiscrete/float Box, a failed --url probe's
labels, output paths that cannot be written, and what --markdown / --json do to the files
they write (bytes outside the block, modes, a FIFO, a symlink)."""

from __future__ import annotations

import json
import os
import selectors
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from transport.probe import report

from .servers import ServerProcess, unique_unix_url
from .test_probe import run_probe

ROOT = Path(__file__).resolve().parents[1]
CHEAP = ("--quick", "--no-floor", "--no-plot", "--count", "50", "--warmup", "5")
"""A --url probe in about a second: no floors, few samples, no figure."""


def _dead_url() -> str:
    return unique_unix_url()  # nothing serves it


def _one_line_usage_error(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("transport-probe: error: "), done.stderr
    assert "probe [" not in done.stderr  # refused before anything was measured


# -- --url: what is a URL, what applies with it ----------------------------------------------


@pytest.mark.parametrize("url", ["notaurl", "unix:relative.sock", "   ", "foo://x", "unix://"])
def test_a_url_that_is_not_one_is_a_usage_error(url: str, tmp_path: Path) -> None:
    """Before: 'notaurl' and 'unix:relative.sock' crashed with a ConnectError traceback (exit
    1), as did the others (or, foo:// and unix://, failed as an unreachable server)."""
    done = run_probe("--url", url, *CHEAP, "--json", str(tmp_path / "o.json"), "--timeout", "1")
    _one_line_usage_error(done)
    assert "--url" in done.stderr
    assert not (tmp_path / "o.json").exists()


def test_an_empty_url_is_a_usage_error_not_the_reference_run(tmp_path: Path) -> None:
    """Before: --url "" (an unset variable) silently ran the reference servers' probe, the
    --batch that does not go with --url accepted, and exited 0."""
    done = run_probe(
        "--url", "", "--backends", "unix", "--lang", "python", "--batch", "1", *CHEAP,
        "--json", str(tmp_path / "o.json"),
    )  # fmt: skip
    _one_line_usage_error(done)
    assert "--url: an empty URL" in done.stderr
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize(
    "flags",
    [["--env", "echo"], ["--env", "vector-echo"], ["--lang", "python"], ["--backends", "unix"]],
)
def test_flags_that_do_not_apply_to_a_url_are_usage_errors(flags: list[str]) -> None:
    """Before: --env echo (the default's value), --lang and --backends were silently ignored
    with --url (docs/probe.md: "--env with --url is a usage error")."""
    done = run_probe("--url", _dead_url(), *flags, *CHEAP, "--json", "-", "--timeout", "1")
    _one_line_usage_error(done)
    assert flags[0] in done.stderr and "does not apply" in done.stderr


# -- --url on a --gym server: any action space gets a legal action ---------------------------

GYM_MODULE = """
import gymnasium as gym
import numpy as np
from gymnasium import spaces as S


class Odd(gym.Env):
    ACT = S.Discrete(2)

    def __init__(self):
        self.observation_space = S.Box(-1, 1, (3,), np.float32)
        self.action_space = self.ACT

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        space = self.action_space
        got = np.asarray(action).astype(space.dtype).reshape(space.shape)
        if not space.contains(got):
            raise ValueError(f"illegal action {action!r} for {space}")
        return np.zeros(3, np.float32), 1.0, False, False, {}


class Raises(Odd):
    def step(self, action):
        raise ValueError("boom in step")


def register(name, act):
    globals()[name] = type(name, (Odd,), {"ACT": act})
    gym.register(id=f"{name}-v0", entry_point=f"tprobe_odd_spaces:{name}")


register("MultiBin", S.MultiBinary(3))
register("IntBox", S.Box(-3, 3, (2,), np.int32))
register("IntBoxAbove", S.Box(2, 9, (2,), np.int32))
gym.register(id="Raises-v0", entry_point="tprobe_odd_spaces:Raises")
"""


@contextmanager
def gym_server(folder: Path, env_id: str, num_envs: int = 2) -> Iterator[str]:
    """``transport-serve URL --gym tprobe_odd_spaces:ENV_ID`` run in ``folder`` (where the
    module is); yields the URL once it is ready, stops the server after."""
    (folder / "tprobe_odd_spaces.py").write_text(GYM_MODULE)
    url = unique_unix_url()
    environ = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "transport.tools.serve_cli", url]
    command += ["--gym", f"tprobe_odd_spaces:{env_id}", "--num-envs", str(num_envs)]
    proc = subprocess.Popen(
        command, cwd=folder, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        selector = selectors.DefaultSelector()
        selector.register(proc.stdout, selectors.EVENT_READ)
        assert selector.select(120), "the --gym server printed nothing in 120 s"
        line = proc.stdout.readline().strip()
        assert line.startswith("ready "), f"{line!r} {proc.stderr.read() if line == '' else ''}"
        yield line.split(" ", 1)[1]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        assert not os.path.exists(url.partition("://")[2])


@pytest.mark.parametrize("env_id", ["MultiBin-v0", "IntBox-v0", "IntBoxAbove-v0"])
def test_url_probes_a_gym_server_of_any_action_space(env_id: str, tmp_path: Path) -> None:
    """Before: FAILED: AttributeError: 'MultiBinary' (or 'Box') object has no attribute
    'start', exit 1. The env refuses an illegal action, so a measured row means legal ones."""
    with gym_server(tmp_path, env_id) as url:
        done = run_probe("--url", url, *CHEAP, "--json", str(tmp_path / "o.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "o.json").read_text())
    (row,) = doc["rows"]
    assert doc["failed"] == [] and row["batch"] == 2 and row["steps_per_s"] > 0
    assert row["env"] == f"tprobe_odd_spaces:{env_id}" == doc["settings"]["env"]


def test_lowest_action_is_legal_in_every_space() -> None:
    from gymnasium import spaces as S

    from transport.probe.runner import lowest_action

    for space in [
        S.Discrete(4, start=1),
        S.MultiDiscrete([3, 4], start=[1, -2]),
        S.MultiDiscrete(np.array([[2, 3], [4, 5]])),
        S.MultiBinary(3),
        S.MultiBinary([2, 2]),
        S.Box(-3, 3, (2,), np.int32),
        S.Box(2, 9, (2,), np.int64),
        S.Box(0.5, 1.0, (2,), np.float32),
        S.Box(-np.inf, np.inf, (), np.float32),
        S.Dict({"a": S.Discrete(2, start=-1), "b": S.Box(1, 2, (1,), np.float32)}),
        S.Tuple((S.MultiBinary(2), S.Discrete(3))),
    ]:
        assert space.contains(lowest_action(space)), space


# -- a failed --url probe names the server's env, never "echo" -------------------------------


def test_a_failed_url_probe_names_the_servers_env(tmp_path: Path) -> None:
    """Before: the heading said "Echo env (transport cost only)", the JSON settings.env "echo"
    and the failure "unix/unknown (batch -)", though the HELLO had named the env."""
    with gym_server(tmp_path, "Raises-v0") as url:
        done = run_probe("--url", url, *CHEAP, "--json", str(tmp_path / "o.json"))
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads((tmp_path / "o.json").read_text())
    env = "tprobe_odd_spaces:Raises-v0"
    assert doc["settings"]["env"] == env and "echo" not in done.stdout.lower()
    (failed,) = doc["failed"]
    assert (failed["server"], failed["batch"], failed["env"]) == ("python", 2, env)
    assert f"FAILED: unix/python (batch 2, env {env}): " in done.stdout
    assert f"{env} env (the server's own" in done.stdout


def test_a_url_that_nothing_serves_is_an_unknown_env(tmp_path: Path) -> None:
    done = run_probe("--url", _dead_url(), *CHEAP, "--timeout", "1", "--json", "-")
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["settings"]["env"] == "unknown" and doc["failed"][0]["env"] == "unknown"
    assert "echo" not in done.stderr.lower() and "unknown env" in done.stderr


# -- output paths ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "where"),
    [
        ("--json", "file/out.json"),  # its folder is a file
        ("--json", "/proc/nope/out.json"),  # a folder that cannot be made
        ("--json", ""),
        ("--json", "."),  # a directory
        ("--markdown", "."),
        ("--markdown", "file/RESULTS.md"),
        ("--markdown", "half.md"),  # a begin marker without its end
        ("--plot", "file/x.png"),
        ("--plot", "x.nosuchformat"),
        ("--plot", "bars-dir.png"),  # x.png is fine, its second figure's path is a folder
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_measuring(
    flag: str, where: str, tmp_path: Path
) -> None:
    """Before: a traceback after the whole measurement, the results lost."""
    (tmp_path / "file").write_text("a file, not a folder\n")
    (tmp_path / "half.md").write_text(f"# notes\n{report.BEGIN}\nno end marker\n")
    (tmp_path / "bars-dir-bars.png").mkdir()
    args = ["--url", _dead_url(), "--quick", "--no-floor", "--timeout", "1"]
    if flag != "--json":
        args += ["--json", str(tmp_path / "o.json")]
    if flag != "--plot":
        args.append("--no-plot")
    path = where if where.startswith("/") or where == "" else str(tmp_path / where)
    done = subprocess.run(
        [sys.executable, "-m", "transport.tools.probe_cli", *args, flag, path],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    _one_line_usage_error(done)
    assert flag in done.stderr
    assert not (tmp_path / "o.json").exists()


def test_a_write_error_after_the_run_is_one_line_and_keeps_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An output that fails as it is written (the checks before the run passed: here they are
    skipped) is one line on stderr and exit 1; the table is on stdout, the other outputs are
    written."""
    from transport.tools import probe_cli

    monkeypatch.setattr(report, "output_problem", lambda *a, **k: None, raising=False)
    markdown = tmp_path / "RESULTS.md"
    with ServerProcess(unique_unix_url(), env="echo", lang="python", num_envs=2) as server:
        status = probe_cli.main(
            ["--url", server.url, *CHEAP, "--json", "/proc/nope/out.json", "--markdown",
             str(markdown)]
        )  # fmt: skip
    out, err = capsys.readouterr()
    assert status == 1
    assert "unix     python      2" in out and "summary:" in out  # the results
    (line,) = [x for x in err.splitlines() if "cannot write" in x]
    assert line.startswith("transport-probe: error: cannot write --json /proc/nope/out.json: ")
    assert report.BEGIN in markdown.read_text()  # the outputs that can be written are


# -- what the writes do to the files ---------------------------------------------------------


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_markdown_keeps_every_byte_outside_its_block_and_the_files_mode(tmp_path: Path) -> None:
    """Before: a CRLF file came back LF, a byte that is not UTF-8 raised UnicodeDecodeError,
    and the file's mode became 0600 (mkstemp's)."""
    target = tmp_path / "notes.md"
    head = b"title\r\nkeep these CRLF bytes \xe9\r\n\r\n"
    tail = b"\r\nafter the block\r\n"
    target.write_bytes(head + f"{report.BEGIN}\r\nold\r\n{report.END}".encode() + tail)
    target.chmod(0o640)
    report.update_markdown(str(target), f"{report.BEGIN}\nnew\nlines\n{report.END}")
    data = target.read_bytes()
    assert data.startswith(head) and data.endswith(tail)
    assert b"new\r\nlines\r\n" in data and b"old" not in data  # the block in the file's endings
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    appended = tmp_path / "plain.md"
    appended.write_bytes(b"a\r\nb\r\n")
    appended.chmod(0o644)
    report.update_markdown(str(appended), f"{report.BEGIN}\nx\n{report.END}")
    block = f"{report.BEGIN}\r\nx\r\n{report.END}\r\n"
    assert appended.read_bytes() == b"a\r\nb\r\n\r\n" + block.encode()
    assert stat.S_IMODE(appended.stat().st_mode) == 0o644


def test_new_outputs_get_the_mode_open_gives_them(tmp_path: Path) -> None:
    """Before: the JSON (and a new RESULTS.md) were created 0600, the PNGs 0644."""
    expected = 0o666 & ~_umask()
    report.write_json({"a": 1}, str(tmp_path / "sub" / "new.json"))
    report.update_markdown(str(tmp_path / "new.md"), f"{report.BEGIN}\n{report.END}")
    for path in (tmp_path / "sub" / "new.json", tmp_path / "new.md"):
        assert stat.S_IMODE(path.stat().st_mode) == expected, path


def test_writes_go_through_a_symlink_and_into_a_fifo(tmp_path: Path) -> None:
    """Before: the rename replaced a symlink (or /dev/null, as root) with a regular file."""
    real = tmp_path / "real.json"
    real.write_text("{}\n")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    report.write_json({"a": 1}, str(link))
    assert link.is_symlink() and json.loads(real.read_text()) == {"a": 1}
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        report.write_json({"b": 2}, str(fifo))
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)
        assert json.loads(os.read(reader, 4096)) == {"b": 2}
    finally:
        os.close(reader)
