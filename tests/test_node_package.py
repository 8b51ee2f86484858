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


# -- issue 26 item 5: the package as a consumer gets it ------------------------------------------

BOX_ENV_TS = """
// A user's Box env in TypeScript, compiled in the user's project without @types/node: array
// actions arrive as Float64Arrays, seeds as bigints (docs/node.md, "A user's env").
import { type Env, type Spaces, serve } from "@transport/node-bridge";
import { dictbox } from "@transport/node-bridge/generated";
import { Ring } from "@transport/node-bridge/channels";

export class Drift implements Env<dictbox.StepResultInput> {
  x = 0;
  y = 0;
  readonly out: dictbox.StepResultInput = {
    grid: new Float32Array(50), vec: new Float32Array(4), reward: 0, terminated: false,
    truncated: false, distance: 0,
  };

  spaces(): Spaces {
    return { obsN: 54, actN: 2 };
  }

  reset(seed?: bigint): dictbox.StepResultInput {
    const s: bigint = seed ?? 0n;
    this.x = Number(s % 5n);
    this.y = 0;
    return this.view();
  }

  step(action: Float64Array): dictbox.StepResultInput {
    this.x = Math.min(4, Math.max(0, this.x + action[0]!));
    this.y = Math.min(4, Math.max(0, this.y + action[1]!));
    return this.view();
  }

  view(): dictbox.StepResultInput {
    (this.out.vec as Float32Array).set([this.x / 4, this.y / 4, 1, 1]);
    this.out.distance = Math.hypot(4 - this.x, 4 - this.y);
    this.out.reward = -0.1;
    return this.out;
  }
}

export const channels: string = typeof Ring;

export async function start(url: string): Promise<{ url: string; close(): Promise<void> }> {
  return serve(() => new Drift(), url, { schema: dictbox.SCHEMA, numEnvs: 2, envName: "drift" });
}
"""

BOX_MAIN_JS = """
const { start, channels } = require("./out/box_env.js");
(async () => {
  if (channels !== "function") throw new Error("channels not imported");
  const server = await start(process.argv[2]);
  process.stdout.write(`ready ${server.url}\\n`);
  process.on("SIGTERM", async () => { await server.close(); process.exit(0); });
})().catch((error) => { process.stderr.write(String(error.stack)); process.exit(1); });
"""

CONSUMER_TSCONFIG = {
    "compilerOptions": {
        "strict": True,
        "module": "node16",
        "moduleResolution": "node16",
        "target": "ES2022",
        "lib": ["ES2022"],
        "types": [],
        "skipLibCheck": True,
        "outDir": "out",
    },
    "files": ["box_env.ts"],
}


def test_the_bin_is_executable_and_outside_what_a_rebuild_recreates(project: Path) -> None:
    """The bin's file is not under dist/ (which a build deletes and re-emits 0644), is
    executable in the source tree, and the installed bin runs."""
    manifest = json.loads((BRIDGE / "package.json").read_text())
    for target in manifest["bin"].values():
        assert not target.startswith("dist/"), f"{target}: a rebuild drops its execute bit"
        assert os.access(BRIDGE / target, os.X_OK), f"{target} is not executable"
    installed = project / "node_modules" / ".bin" / "transport-serve-node"
    done = _run([str(installed), "--help"], project, timeout=60)
    assert done.returncode == 0 and "usage" in done.stdout, done.stdout + done.stderr


def test_channels_and_generated_import_by_their_documented_names(project: Path) -> None:
    """docs/channels.md: ``@transport/node-bridge/channels`` and ``/generated``."""
    script = (
        'const { Ring, PolicyBoard, RunControl } = require("@transport/node-bridge/channels");'
        'const { experience } = require("@transport/node-bridge/generated");'
        "console.log([Ring, PolicyBoard, RunControl].map((f) => typeof f).join(),"
        " experience.TransitionCodec.size);"
    )
    done = _run(["node", "-e", script], project, timeout=60)
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.split() == ["function,function,function", "1816"], done.stdout


def test_a_typescript_box_env_compiles_without_types_node_and_serves(project: Path) -> None:
    """A TS env with ``step(action: Float64Array)`` and ``reset(seed?: bigint)`` type-checks
    against the installed package (tsc --strict, no @types/node in the project), runs with node,
    and a Python trainer steps it with Box actions over shm."""
    assert not (project / "node_modules" / "@types" / "node").exists(), "@types/node installed"
    (project / "box_env.ts").write_text(BOX_ENV_TS)
    (project / "box_main.js").write_text(BOX_MAIN_JS)
    (project / "tsconfig.json").write_text(json.dumps(CONSUMER_TSCONFIG))
    tsc = BRIDGE / "node_modules" / "typescript" / "bin" / "tsc"
    compiled = _run(["node", str(tsc), "-p", "."], project)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    url = unique_url("shm") + "?num_envs=2"
    proc = subprocess.Popen(
        ["node", "box_main.js", url],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("ready "), f"{line!r} {proc.stderr.read() if proc.stderr else ''}"
        with transport.connect(line.split(" ", 1)[1], timeout=10) as client:
            assert client.schema.name == "dictbox" and client.num_envs == 2
            first = client.reset(7, copy=True)  # env 0: seed 7 -> x = 2; env 1: seed 8 -> x = 3
            np.testing.assert_allclose(first.vec[:, 0], [0.5, 0.75])
            after = client.step(np.array([[1.0, 0.5], [-1.0, 1.0]], np.float32), copy=True)
            np.testing.assert_allclose(after.vec[:, :2], [[0.75, 0.125], [0.5, 0.25]])
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def test_a_folder_install_links_a_bin_that_a_rebuild_keeps(tmp_path: Path) -> None:
    """``npm install path/to/node_bridge`` (a link to the checkout): the installed bin resolves
    to a file outside dist/ (a rebuild deletes dist/ and re-emits it 0644) and runs."""
    require_lang("node")
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed")
    (tmp_path / "package.json").write_text(
        '{"name": "linked", "version": "1.0.0", "private": true}'
    )
    installed = _run(
        [npm, "install", "--offline", "--no-audit", "--no-fund", str(BRIDGE)], tmp_path, timeout=120
    )
    if installed.returncode != 0:
        pytest.skip(f"npm install --offline of the folder failed: {installed.stderr[-400:]}")
    bin_link = tmp_path / "node_modules" / ".bin" / "transport-serve-node"
    target = bin_link.resolve()
    assert target.is_relative_to(BRIDGE.resolve()), target
    assert "dist" not in target.relative_to(BRIDGE.resolve()).parts, target
    assert os.access(target, os.X_OK)
    done = _run([str(bin_link), "--help"], tmp_path, timeout=60)
    assert done.returncode == 0 and "usage" in done.stdout, done.stdout + done.stderr
