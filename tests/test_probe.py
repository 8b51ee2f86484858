"""transport-probe end to end: a real process over the available backends, servers and floor."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from transport.backends import BACKENDS
from transport.probe import report, servers
from transport.probe.floor import FLOOR_OF_SCHEME
from transport.probe.histogram import LogHistogram
from transport.probe.loops import TICK_EVERY, closed_loop, warm_up
from transport.probe.progress import Progress
from transport.probe.runner import Point, points_for_payloads

from .servers import ServerProcess, unique_unix_url

ROOT = Path(__file__).resolve().parents[1]
ROW_KEYS = {
    "backend",
    "server",
    "batch",
    "payload_bytes",
    "p50_us",
    "p90_us",
    "p99_us",
    "p999_us",
    "max_us",
    "steps_per_s",
    "ratio_to_floor",
}
MACHINE_KEYS = {
    "cpu_model",
    "cpu_count",
    "affinity",
    "kernel",
    "dev_shm",
    "python",
    "node",
    "pyzmq",
    "libzmq",
    "numpy",
}


def probe_command() -> list[str]:
    script = shutil.which("transport-probe")
    if script is not None:
        return [script]
    return [sys.executable, "-m", "transport.tools.probe_cli"]


def run_probe(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*probe_command(), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def tagged(tag: str) -> list[str]:
    """Files in the temp dir and /dev/shm, and processes, whose names carry ``tag``."""
    found = servers.leftovers(tag)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if tag.encode() in cmdline and int(pid) != os.getpid():
            found.append(f"process {pid}: {cmdline.decode(errors='replace')[:200]}")
    return found


def check_rows(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        assert ROW_KEYS <= row.keys(), row.keys()
        assert row["server"] in ("python", "node", "c")
        assert row["count"] >= 1
        assert 0 <= row["p50_us"] <= row["p90_us"] <= row["p99_us"] <= row["p999_us"]
        assert row["p999_us"] <= row["max_us"]
        hist = LogHistogram.from_json(row["histogram"])  # the table's numbers are the histogram's
        assert hist.total == row["count"]
        assert hist.percentile(50.0) / 1000.0 == pytest.approx(row["p50_us"])


def run_quick(out: Path) -> dict[str, Any]:
    """``transport-probe --quick`` with JSON, plot and markdown into ``out``: the main job,
    about a minute on 2 cores, so one test runs it once and checks everything it made."""
    results_md = out / "RESULTS.md"
    others = "# Results\n\n## Codec (written by someone else)\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    results_md.write_text(others)
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    proc = subprocess.Popen(
        [
            *probe_command(),
            "--quick",
            "--json",
            str(out / "probe.json"),
            "--plot",
            str(out / "probe.png"),
            "--markdown",
            str(results_md),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = proc.communicate(timeout=600)
    return {
        "status": proc.returncode,
        "stdout": stdout,
        "stderr": stderr,
        "dir": out,
        "others": others,
        "tag": f"tprobe-{proc.pid}-",
        "shm_before": shm_before,
    }


def check_exits_zero_and_prints_the_table(quick_run: dict[str, Any]) -> None:
    assert quick_run["status"] == 0, quick_run["stdout"] + quick_run["stderr"]
    out = quick_run["stdout"]
    assert "p99.9 us" in out and "c-floor-futex" in out and "c-floor-unix" in out
    assert "probe [" in quick_run["stderr"]  # plain progress lines: stderr is not a terminal
    # auto:// is a client-side alias: not probed by default, so no "skipped" lines for it
    assert "auto" not in quick_run["stderr"] and "auto" not in out


def check_json_schema(quick_run: dict[str, Any]) -> None:
    doc = json.loads((quick_run["dir"] / "probe.json").read_text())
    assert doc["tool"] == "transport-probe" and doc["ok"] is True and doc["failed"] == []
    assert MACHINE_KEYS <= doc["machine"].keys()
    assert doc["floor"]["reference"] == "c-floor-futex"
    assert doc["floor"]["floor_of_backend"] == FLOOR_OF_SCHEME
    rows = doc["rows"]
    check_rows(rows)
    floors = {(r["backend"], r["batch"]): r for r in rows if r["server"] == "c"}
    assert {name for name, _ in floors} == {
        "c-floor-spin",
        "c-floor-futex",
        "c-floor-unix",
        "c-floor-tcp",
        "c-floor-shm",
    }
    # the shm floor of a batch moves its bytes: the request in, the results back
    shm_floors = {batch: r for (name, batch), r in floors.items() if name == "c-floor-shm"}
    assert shm_floors and all(r["payload_bytes"] == b * 2557 for b, r in shm_floors.items())
    assert all(f["ratio_to_floor"] is None for f in floors.values())
    raw = {
        (r["backend"], r["server"], r["batch"]): r for r in rows if r["backend"].startswith("raw-")
    }
    assert ("raw-unix", "python", 1) in raw and ("raw-unix", "node", 1) in raw
    assert all(f["ratio_to_floor"] is None for f in raw.values())
    rows = [r for r in rows if not r["backend"].startswith("raw-")]
    measured = {(r["backend"], r["server"]) for r in rows if r["server"] != "c"}
    skipped = {(s["backend"], s["server"]) for s in doc["skipped"]}
    for backend in servers.default_backends():  # each is measured or skipped with a reason
        for lang in ("python", "node"):
            assert (backend, lang) in measured | skipped, (backend, lang)
    assert ("unix", "python") in measured and ("http", "python") in measured
    assert all(s["reason"] for s in doc["skipped"])
    for row in rows:
        if row["server"] == "c":
            continue
        assert row["backend"] in BACKENDS
        assert row["batch"] in (1, 8, 64)
        assert row["payload_bytes"] == row["batch"] * 2557
        # each row against the floor that applies to it: the raw floor of its scheme and server
        # language (same bytes) where there is one, else the C floor of the same bytes (shm's
        # through a shared mapping, the sockets' over a socket)
        name = FLOOR_OF_SCHEME[row["backend"]]
        floor = raw.get((f"raw-{row['backend']}", row["server"], row["batch"]))
        if floor is None:
            floor = floors[(name, row["batch"])]
        assert row["floor"] == floor["backend"]
        assert row["ratio_to_floor"] == pytest.approx(
            row["p50_us"] / floor["p50_us"], rel=0.01, abs=0.01
        )
        assert row["steps_per_s"] > 0
    batches = {r["batch"] for r in rows if (r["backend"], r["server"]) == ("unix", "python")}
    assert batches == {1, 8, 64}


def check_plot_and_markdown(quick_run: dict[str, Any]) -> None:
    png = (quick_run["dir"] / "probe.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    text = (quick_run["dir"] / "RESULTS.md").read_text()
    assert text.startswith(quick_run["others"])  # the other sections are untouched
    block = text[text.index(report.BEGIN) : text.index(report.END)]
    assert "transport-probe --quick" in block and "| unix | python | 1 |" in block


def check_leaves_nothing_behind(quick_run: dict[str, Any]) -> None:
    assert tagged(quick_run["tag"]) == []
    if os.path.isdir("/dev/shm"):
        new = set(os.listdir("/dev/shm")) - quick_run["shm_before"]
        assert not [n for n in new if n.startswith("transport-tprobe")]


def test_quick_run(tmp_path: Path) -> None:
    """The main job as README runs it: the table, the JSON, the plot and markdown, no leftovers
    (one test: the run is shared, and a module fixture would run once per xdist worker)."""
    quick_run = run_quick(tmp_path)
    check_exits_zero_and_prints_the_table(quick_run)
    check_json_schema(quick_run)
    check_plot_and_markdown(quick_run)
    check_leaves_nothing_behind(quick_run)


def test_probe_a_running_server_by_url(tmp_path: Path) -> None:
    with ServerProcess(unique_unix_url(), env="echo", lang="python", num_envs=8) as server:
        done = run_probe(
            "--url", server.url, "--quick", "--no-floor", "--no-plot", "--json",
            str(tmp_path / "url.json"),
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "url.json").read_text())
    (row,) = doc["rows"]
    check_rows(doc["rows"])
    assert (row["backend"], row["server"], row["batch"]) == ("unix", "python", 8)
    assert row["payload_bytes"] == 8 * 2557 and row["ratio_to_floor"] is None


def test_a_url_row_is_compared_with_the_socket_floor_of_its_bytes(tmp_path: Path) -> None:
    """The floors of the row's own bytes: the C socket floor and the raw floor of its scheme
    and server language, which is the one that applies."""
    with ServerProcess(unique_unix_url(), env="echo", lang="python", num_envs=8) as server:
        done = run_probe("--url", server.url, "--quick", "--no-plot", "--json", "-")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(done.stdout)["rows"]
    (row,) = [r for r in rows if r["env"] is not None]
    (floor,) = [r for r in rows if r["backend"] == "c-floor-unix"]
    assert floor["batch"] == 8 and floor["payload_bytes"] == row["payload_bytes"]
    (raw,) = [r for r in rows if r["backend"] == "raw-unix"]
    assert (raw["server"], raw["batch"], raw["payload_bytes"]) == ("python", 8, 8 * 2557)
    assert row["floor"] == "raw-unix" and row["env"] == "echo"
    assert row["ratio_to_floor"] == pytest.approx(row["p50_us"] / raw["p50_us"], rel=0.01)


def test_an_auto_url_reports_the_backend_it_chose(tmp_path: Path) -> None:
    name = f"tprobe-auto-{os.getpid()}"
    with ServerProcess(f"unix:///tmp/transport-{name}.sock", env="echo", lang="python"):
        done = run_probe(
            "--url", f"auto://{name}", "--quick", "--no-floor", "--no-plot", "--json", "-",
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = json.loads(done.stdout)["rows"]
    assert (row["backend"], row["url"]) == ("unix", f"unix:///tmp/transport-{name}.sock")


def test_a_dead_url_is_a_failure(tmp_path: Path) -> None:
    url = f"unix://{tempfile.gettempdir()}/tprobe-missing-{os.getpid()}.sock"
    done = run_probe("--url", url, "--quick", "--no-floor", "--no-plot", "--json", "-")
    assert done.returncode == 1
    doc = json.loads(done.stdout)
    assert doc["ok"] is False and doc["rows"] == [] and doc["failed"][0]["reason"]
    assert "failure" in done.stderr


def test_open_loop_rate_and_payload_rows(tmp_path: Path) -> None:
    done = run_probe(
        "--backends", "unix", "--lang", "python", "--payload", "64,5K", "--rate", "2000",
        "--count", "100", "--warmup", "10", "--no-floor", "--plot", str(tmp_path / "p.png"),
        "--json", str(tmp_path / "p.json"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "p.json").read_text())
    rows = {(r["message"], r["batch"]): r for r in doc["rows"]}
    assert set(rows) == {("health", 1), ("step", 2)}
    assert rows[("health", 1)]["payload_bytes"] == 1
    assert rows[("step", 2)]["payload_bytes"] == 2 * 2557
    assert rows[("step", 2)]["target_bytes"] == 5 * 1024
    for row in rows.values():
        assert row["mode"] == "open" and row["rate"] == 2000
        assert row["service_p50_us"] <= row["p50_us"]  # measured from the due time: never less
        assert row["count"] == 100  # (no timing assertion: the rate depends on the machine)
        assert 0 < row["round_trips_per_s"] <= 2000 * 1.05


def test_help_explains_the_options() -> None:
    done = run_probe("--help")
    assert done.returncode == 0
    for option in (
        "--url", "--backends", "--lang", "--count", "--batch", "--payload", "--json", "--plot",
        "--warmup", "--rate", "--sweep", "--quick", "--markdown", "skipped", "payload_bytes",
    ):  # fmt: skip
        assert option in done.stdout, option


def test_bad_usage_exits_2() -> None:
    assert run_probe("--lang", "cobol").returncode == 2
    assert run_probe("--batch", "0").returncode == 2
    unknown = run_probe("--backends", "unix,nosuch")
    assert unknown.returncode == 2 and "nosuch" in unknown.stderr


# -- pieces ----------------------------------------------------------------------------------------


def test_an_explicit_alias_is_skipped_with_one_line() -> None:
    done = run_probe("--backends", "auto", "--lang", "python", "--quick", "--no-floor",
                     "--no-plot", "--json", "-")  # fmt: skip
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if line.startswith("probe [")]
    assert len(progress) == 1 and "client-side alias" in progress[0]  # three cells, one line
    assert len(json.loads(done.stdout)["skipped"]) == 3


def test_progress_moves_within_a_row() -> None:
    import io

    stream = io.StringIO()
    progress = Progress(1, bar=True, stream=stream)
    calls = 0

    def call() -> None:
        nonlocal calls
        calls += 1

    tick = progress.ticker("unix/python/b1", "measure", 3 * TICK_EVERY)
    assert tick is not None
    closed_loop(call, 3 * TICK_EVERY, LogHistogram(), max_ns=10**12, tick=tick)
    warm_up(call, TICK_EVERY, 10**12, lambda: 0, progress.ticker("x", "warm-up", TICK_EVERY))
    text = stream.getvalue()
    for done in (TICK_EVERY, 2 * TICK_EVERY, 3 * TICK_EVERY):
        assert f"unix/python/b1 measure {done}/{3 * TICK_EVERY}" in text
    assert f"x warm-up {TICK_EVERY}/{TICK_EVERY}" in text
    assert Progress(1, bar=False).ticker("a", "b", 1) is None  # no bar: no per-loop cost


def test_sweep_points_map_targets_to_batches() -> None:
    points = points_for_payloads([64, 256, 1024, 4096, 4 * 2**20], 2557)
    assert points == [
        Point(1, "health", 64),  # 256 maps to the same point
        Point(1, "step", 1024),
        Point(2, "step", 4096),
        Point(1640, "step", 4 * 2**20),
    ]


def test_markdown_block_replaces_only_its_block() -> None:
    before = "# R\n\nintro\n\n" + report.BEGIN + "\nold\n" + report.END + "\n\n## other\ntext\n"
    after = report.replace_block(before, report.BEGIN + "\nnew\n" + report.END)
    assert (
        after == "# R\n\nintro\n\n" + report.BEGIN + "\nnew\n" + report.END + "\n\n## other\ntext\n"
    )
    appended = report.replace_block("# R\n", report.BEGIN + "\nx\n" + report.END)
    assert appended == "# R\n\n" + report.BEGIN + "\nx\n" + report.END + "\n"
    assert report.BEGIN in report.replace_block(None, report.BEGIN + "\n" + report.END)
    with pytest.raises(ValueError):
        report.replace_block(report.BEGIN + " no end", "x")


def test_unavailable_backends_and_languages_are_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    assert servers.backend_unavailable("unix") is None
    assert "registry" in (servers.backend_unavailable("carrier-pigeon") or "")
    monkeypatch.setitem(BACKENDS, "broken", "transport.backends.does_not_exist")
    monkeypatch.setitem(servers.URL_TEMPLATES, "broken", lambda tag, n: f"broken://{tag}")
    assert "does not import" in (servers.backend_unavailable("broken") or "")
    monkeypatch.setitem(BACKENDS, "untemplated", "transport.backends.unix")
    assert "no URL template" in (servers.backend_unavailable("untemplated") or "")
    monkeypatch.setattr(servers, "NODE_SERVER", servers.ROOT / "node_bridge" / "dist" / "nope.js")
    assert "missing" in (servers.lang_unavailable("node") or "")
    assert servers.lang_unavailable("python") is None


def test_url_templates_are_unique_per_tag() -> None:
    for scheme, template in servers.URL_TEMPLATES.items():
        url = template("tprobe-x-1", 8)
        assert url.startswith(scheme + "://")
        if scheme in ("unix", "zmq+ipc", "shm"):
            assert "tprobe-x-1" in url


def test_probe_a_users_server_with_its_schema(tmp_path: Path) -> None:
    """--url with --schema: any schema, the env's own legal actions, no echo check."""
    tetris = str(ROOT / "schema" / "tetris.toml")
    extra = ["--schema", tetris]
    with ServerProcess(
        unique_unix_url(), env="contract", lang="python", num_envs=4, extra=extra
    ) as server:
        done = run_probe(
            "--url", server.url, "--schema", tetris, "--quick", "--no-floor", "--no-plot",
            "--json", "-",
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = json.loads(done.stdout)["rows"]
    assert (row["backend"], row["batch"], row["payload_bytes"]) == ("unix", 4, 4 * 912)
    assert run_probe("--schema", tetris, "--quick").returncode == 2  # --schema needs --url


@pytest.mark.parametrize("lang", ["python", "node"])
def test_raw_zmq_ipc_servers_remove_their_socket_file_when_stopped_at_once(lang: str) -> None:
    """Regression (CI: a quick run left /tmp/tprobe-*.raw.ipc): a SIGTERM right after "ready"
    found Node's default action (the handler came after the line) and Python blocked in a recv
    that a signal on one of libzmq's threads does not interrupt (killed after 10 s)."""
    from transport.probe.raw import RawServer

    if lang == "node" and shutil.which("node") is None:
        pytest.skip("node is missing")
    for i in range(8):
        server = RawServer("zmq+ipc", lang, f"trawstop-{os.getpid()}-{i}", 8, 64)
        path = server.address.removeprefix("ipc://")
        server.close()
        assert server.proc.returncode in (0, -15), server.proc.returncode  # not killed
        assert not os.path.exists(path), f"{lang} raw server {i} left {path}"
