"""A user's own Node env as a first-class citizen (issue 12 item 9), end to end and outside the
repository: node_bridge packed with ``npm pack``, installed offline from the tarball into a temp
project, a plain-JavaScript env server (no build step) for a schema the project has never seen
(only its own structs) that loads the schema's compiled IR at run time, and a Python trainer
that connects to it with no schema file, over every backend.

Offline install (docs/node.md, "Installing the package"): ``npm install --offline ./tarball``
needs the dependencies' registry metadata, which the npm cache does not hold after ``npm ci``;
``npm ci --offline`` with a lockfile that pins the tarball and node_bridge's own locked
dependencies (resolved URLs and integrity hashes: what ``npm ci`` in node_bridge cached) works.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import transport

from .servers import ROOT, ServerProcess, require_lang, unique_url

BRIDGE = ROOT / "node_bridge"
SCHEMES = ["unix", "http", "zmq+ipc", "zmq+tcp", "shm"]

LANTERN_TOML = """
[schema]
name = "lantern_maze"
version = 1
layout = "natural"

[env]
result = "LanternView"
request = "LanternMove"

[structs.LanternView]
fields = [
  { name = "observation", type = "f32[3,4]", role = "observation" },
  { name = "reward",      type = "f32",      role = "reward" },
  { name = "terminated",  type = "bool",     role = "terminated" },
  { name = "truncated",   type = "bool",     role = "truncated" },
  { name = "action_mask", type = "bool[3]",  role = "action_mask" },
  { name = "oil",         type = "u16" },
]

[structs.LanternMove]
fields = [{ name = "action", type = "u8", role = "action" }]
"""

LANTERN_SERVER = """
// A plain-JavaScript env server: the package by name, the schema's IR loaded at run time.
const { serve, loadSchemaFile } = require("@transport/node-bridge");
const schema = loadSchemaFile("lantern_maze.schema.json");

class LanternMaze {
  constructor() { this.oil = 0; this.t = 0; this.seed = 0; }
  spaces() { return { obsN: 12, actN: 3 }; }
  view() {
    const observation = new Float32Array(12);
    for (let i = 0; i < 12; i++) observation[i] = this.seed + this.t * 0.5 + i;
    return {
      observation, reward: this.t, terminated: this.oil === 0, truncated: false,
      action_mask: [true, true, this.oil > 1], oil: this.oil,
    };
  }
  reset(seed) {
    this.seed = seed === undefined ? 0 : Number(seed % 1000n);
    this.oil = 5;
    this.t = 0;
    return this.view();
  }
  step(action) { this.t += 1; this.oil = Math.max(0, this.oil - 1 - action); return this.view(); }
}

(async () => {
  const options = { schema, numEnvs: 2, envName: "lantern" };
  const server = await serve(() => new LanternMaze(), process.argv[2], options);
  process.stdout.write(`ready ${server.url}\\n`);
  const stop = async () => { await server.close(); process.exit(0); };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
})().catch((error) => { process.stderr.write(String(error.stack)); process.exit(1); });
"""


def _run(command: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def project() -> Iterator[Path]:
    """node_bridge packed and installed offline into a fresh project outside the repository."""
    require_lang("node")
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed")
    work = Path(tempfile.mkdtemp(prefix="transport-user-project-"))
    try:
        packed = _run([npm, "pack", "--ignore-scripts", "--pack-destination", str(work)], BRIDGE)
        assert packed.returncode == 0, packed.stderr
        tarball = next(work.glob("*.tgz"))
        manifest = json.loads((BRIDGE / "package.json").read_text())
        lock = json.loads((BRIDGE / "package-lock.json").read_text())
        digest = base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
        dependency = {"@transport/node-bridge": f"file:{tarball}"}
        packages: dict[str, object] = {
            "": {"name": "lantern", "version": "1.0.0", "dependencies": dependency},
            "node_modules/@transport/node-bridge": {
                "version": manifest["version"],
                "resolved": f"file:{tarball}",
                "integrity": f"sha512-{digest}",
                "dependencies": manifest["dependencies"],
                "bin": manifest["bin"],
            },
        }
        for key, entry in lock["packages"].items():
            if key and not entry.get("dev"):
                packages[key] = entry
        root = work / "lantern"
        root.mkdir()
        (root / "package.json").write_text(
            json.dumps(
                {"name": "lantern", "version": "1.0.0", "private": True, "dependencies": dependency}
            )
        )
        (root / "package-lock.json").write_text(
            json.dumps(
                {
                    "name": "lantern",
                    "version": "1.0.0",
                    "lockfileVersion": 3,
                    "requires": True,
                    "packages": packages,
                }
            )
        )
        installed = _run([npm, "ci", "--offline", "--no-audit", "--no-fund"], root)
        if installed.returncode != 0:
            pytest.skip(
                f"npm ci --offline could not install from the cache: {installed.stderr[-400:]}"
            )
        assert (
            root / "node_modules" / "@transport" / "node-bridge" / "dist" / "index.js"
        ).is_file()
        (root / "lantern_maze.toml").write_text(LANTERN_TOML)
        compiled = _run(
            [
                str(ROOT / ".venv" / "bin" / "transport-schema"),
                "inspect",
                "lantern_maze.toml",
                "--json",
            ],
            root,
        )
        assert compiled.returncode == 0, compiled.stderr
        (root / "lantern_maze.schema.json").write_text(compiled.stdout)
        (root / "server.js").write_text(LANTERN_SERVER)
        yield root
    finally:
        shutil.rmtree(work, ignore_errors=True)


class NodeUserServer:
    """``node server.js URL`` in the user's project; waits for its ``ready URL`` line."""

    def __init__(self, root: Path, url: str) -> None:
        self.proc = subprocess.Popen(
            ["node", "server.js", url],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("ready "):
            self.proc.kill()
            raise AssertionError(
                f"the user's server did not start: {line!r} {self.proc.communicate()[1]}"
            )
        self.url = line.split(" ", 1)[1]

    def close(self) -> None:
        """SIGTERM: the server closes (removing its socket file or segment) and exits."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError("the user's server did not exit on SIGTERM") from None
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def test_the_package_is_installed_by_name_outside_the_repository(project: Path) -> None:
    installed = project / "node_modules" / "@transport" / "node-bridge"
    assert not str(project.resolve()).startswith(str(ROOT.resolve()))
    assert (installed / "dist" / "index.d.ts").is_file()
    assert not (installed / "dist" / "test").exists()
    for dependency in ("zeromq", "koffi", "@msgpack/msgpack"):
        assert (project / "node_modules" / dependency / "package.json").is_file(), dependency


@pytest.mark.parametrize("scheme", SCHEMES)
def test_python_trainer_steps_a_plain_js_env_without_a_schema_file(
    project: Path, scheme: str
) -> None:
    """The trainer has no schema file: it discovers lantern_maze from the user's Node server and
    steps it; the results are the env's (shape, values, the schema's own extra field)."""
    url = unique_url(scheme) + ("?num_envs=2" if scheme == "shm" else "")
    server = NodeUserServer(project, url)
    try:
        with transport.connect(server.url, timeout=10) as client:
            assert client.schema.name == "lantern_maze"
            assert client.num_envs == 2
            assert client.server_info["env"] == "lantern"
            first = client.reset(7, copy=True)
            assert first.observation.shape == (2, 3, 4)
            expected = np.arange(12, dtype=np.float32).reshape(3, 4)
            np.testing.assert_array_equal(first.observation[1], expected + 8)  # env 1: seed 8
            np.testing.assert_array_equal(first.oil, [5, 5])
            after = client.step([0, 2], copy=True)
            np.testing.assert_array_equal(after.oil, [4, 2])
            np.testing.assert_array_equal(after.reward, [1, 1])
            np.testing.assert_array_equal(after.observation[0], expected + 7.5)
            np.testing.assert_array_equal(after.action_mask[1], [True, True, True])
    finally:
        server.close()
    if scheme == "shm":
        assert not os.path.exists("/dev/shm/transport-" + url.removeprefix("shm://").split("?")[0])


def test_a_python_server_for_the_users_schema_is_discovered_by_the_same_trainer(
    project: Path,
) -> None:
    """The same schema served by Python (the contract env from the .toml): the trainer needs no
    schema file either way, and both servers announce the same fingerprint."""
    with (
        ServerProcess(
            unique_url("unix"),
            env="contract",
            extra=["--schema", str(project / "lantern_maze.toml")],
        ) as server,
        transport.connect(server.url, timeout=10) as client,
    ):
        ir = json.loads((project / "lantern_maze.schema.json").read_text())
        assert f"{client.schema.fingerprint:016x}" == ir["fingerprint"]
        assert client.reset(1).observation.shape == (3, 4)


def test_typescript_compiled_for_the_project_imports_the_package_by_name(project: Path) -> None:
    """``transport-schema compile`` into the user's project: the TypeScript imports the runtime
    by package name and type-checks against the installed package (tsc --strict)."""
    out = project / "generated"
    compiled = _run(
        [
            str(ROOT / ".venv" / "bin" / "transport-schema"),
            "compile",
            "lantern_maze.toml",
            "--python-out",
            str(project / "py_generated"),
            "--ts-out",
            str(out),
        ],
        project,
    )
    assert compiled.returncode == 0, compiled.stderr
    text = (out / "lantern_maze.ts").read_text()
    assert 'from "@transport/node-bridge/codec"' in text and '"../codec"' not in text
    (project / "use.ts").write_text(
        'import { lantern_maze } from "./generated";\n'
        "export const size: number = lantern_maze.LanternViewCodec.size;\n"
    )
    tsc = BRIDGE / "node_modules" / "typescript" / "bin" / "tsc"
    checked = _run(
        [
            "node",
            str(tsc),
            "--noEmit",
            "--strict",
            "--module",
            "node16",
            "--moduleResolution",
            "node16",
            "--target",
            "ES2022",
            "--skipLibCheck",
            "--typeRoots",
            str(BRIDGE / "node_modules" / "@types"),
            "--types",
            "node",
            "use.ts",
        ],
        project,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_conformance_checks_the_users_schema_in_both_languages(project: Path) -> None:
    """``transport-conformance my_schema.toml`` from the user's project: the Node testee loads
    the schema's IR at run time (no generated code for it) and every check passes."""
    checked = _run(
        [
            str(ROOT / ".venv" / "bin" / "transport-conformance"),
            "lantern_maze.toml",
            "--count",
            "20",
            "--json",
        ],
        project,
    )
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr
    report = json.loads(checked.stdout)
    assert report["ok"] is True and report["totals"]["failed"] == 0, report["totals"]
    assert report["totals"]["ok"] > 0 and "lantern_maze" in json.dumps(report["schemas"])
