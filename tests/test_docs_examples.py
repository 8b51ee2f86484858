"""Docs that run (issue 26 item 4): every fenced example in README.md and docs/*.md is executed.

``python`` blocks run in a subprocess (the venv's Python, a per-page temp folder as the working
directory and on PYTHONPATH); ``ts``/``typescript`` blocks are compiled together with the
package's tsc (``--strict``) against the built node_bridge, imported by its package name
(``@transport/node-bridge``, linked into a temp project's node_modules as a user's install
would be), then each runs with node; ``js`` blocks run with node from the same project;
``sh``/``bash``/``console`` blocks run line by line with bash (a line ending in ``&`` is a
server: started, waited for its ``ready URL`` line, stopped when the page is done). Untagged
blocks are diagrams, layouts and command synopses: not run. ``toml``/``json`` blocks: not run.

A block's setup is declared in HTML comments right before its fence (invisible on the rendered
page; syntax in docs/testing.md, "The docs test"): ``skip REASON``, ``server URL ARGS...``,
``file NAME``, ``prelude`` (hidden code), ``timeout SECONDS``. Every URL in a page's blocks and
markers is renamed to a unique one (the same doc URL to the same unique URL within a page), so
docs keep readable names and tests never collide. One server per page and URL, reused by the
page's blocks; the blocks of a page run in order.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .servers import ROOT, free_port

BRIDGE = ROOT / "node_bridge"
VENV_BIN = Path(sys.executable).parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGS = {
    "python": "python",
    "py": "python",
    "ts": "ts",
    "typescript": "ts",
    "js": "js",
    "javascript": "js",
    "sh": "sh",
    "bash": "sh",
    "shell": "sh",
    "console": "sh",
}
DIRECTIVES = ("skip", "server", "file", "prelude", "timeout", "rename")
DEFAULT_TIMEOUT = 90.0
MARKER_START = "<!-- docs-test:"


@dataclass
class Block:
    """One fenced example and the markers right before it."""

    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None = None
    servers: list[str] = field(default_factory=list)
    file: str | None = None
    prelude: str = ""
    timeout: float = DEFAULT_TIMEOUT
    names: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


class MarkerError(ValueError):
    """A ``docs-test`` marker the test does not understand."""


def parse_page(page: Path) -> list[Block]:
    """The page's runnable blocks (python, ts, js, sh) with their markers, in page order."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    pending: list[str] = []
    i = 0
    while i < len(lines):
        text = lines[i]
        stripped = text.strip()
        if stripped.startswith(MARKER_START):
            body = [stripped[len(MARKER_START) :]]
            while "-->" not in body[-1]:
                i += 1
                body.append(lines[i])
            body[-1] = body[-1][: body[-1].index("-->")]
            pending.append("\n".join(body))
        elif stripped.startswith("```"):
            tag = stripped[3:].strip().split(" ")[0].lower()
            start = i
            i += 1
            code: list[str] = []
            while not lines[i].strip().startswith("```"):
                code.append(lines[i])
                i += 1
            if tag in LANGS:
                block = Block(page, start + 1, LANGS[tag], "\n".join(code) + "\n")
                for marker in pending:
                    apply_marker(block, marker)
                blocks.append(block)
            elif pending:
                raise MarkerError(f"{page}:{start + 1}: docs-test marker on a ```{tag} block")
            pending = []
        elif stripped:
            if pending:
                raise MarkerError(f"{page}:{i + 1}: a docs-test marker must precede a fence")
        i += 1
    return blocks


def apply_marker(block: Block, marker: str) -> None:
    """Apply one marker's directive (``skip``, ``server``, ``file``, ``prelude``, ``timeout``)."""
    head, _, rest = marker.strip().partition("\n")
    word, _, args = head.strip().partition(" ")
    args = args.strip()
    if word == "skip":
        if not args:
            raise MarkerError(f"{block.id}: 'skip' needs a reason")
        block.skip = args
    elif word == "server":
        if not args:
            raise MarkerError(f"{block.id}: 'server' needs a URL")
        block.servers.append(args)
    elif word == "file":
        if not args or "/" in args:
            raise MarkerError(f"{block.id}: 'file' needs a plain file name")
        block.file = args
    elif word == "prelude":
        block.prelude += rest + "\n"
    elif word == "timeout":
        block.timeout = float(args)
    elif word == "rename":
        if not args:
            raise MarkerError(f"{block.id}: 'rename' needs the names of shm channels")
        block.names += args.split()
    else:
        raise MarkerError(f"{block.id}: unknown docs-test directive {word!r} (one of {DIRECTIVES})")


ALL_BLOCKS = [block for page in PAGES for block in parse_page(page)]

URL = re.compile(r"\b(unix|shm|auto|zmq\+ipc|zmq\+tcp|http)://([A-Za-z0-9_./:-]*[A-Za-z0-9_/-])")


class Renamer:
    """A page's doc URLs -> unique ones: the same doc address maps to the same unique address."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def _unique(self, scheme: str, rest: str) -> str:
        if scheme in ("shm", "auto"):
            key = f"name:{rest}"
            if key not in self.names:
                self.names[key] = f"docs-{uuid.uuid4().hex[:12]}"
            return self.names[key]
        if scheme in ("unix", "zmq+ipc"):
            key = f"path:{rest}"
            if key not in self.names:
                suffix = ".sock" if rest.endswith(".sock") else ""
                self.names[key] = f"{tempfile.gettempdir()}/docs-{uuid.uuid4().hex[:12]}{suffix}"
            return self.names[key]
        host, _, path = rest.partition("/")
        if not re.fullmatch(r"[\w.-]+:\d+", host):
            return rest  # no port to rename (an example address, not one the block binds)
        key = f"host:{host}"
        if key not in self.names:
            self.names[key] = f"127.0.0.1:{free_port()}"
        return self.names[key] + ("/" + path if path else "")

    def __call__(self, text: str, names: list[str] | None = None) -> str:
        """``text`` with its URLs (and the quoted channel ``names``) made unique."""
        for name in names or []:
            key = f"channel:{name}"
            if key not in self.names:
                self.names[key] = f"docs-{uuid.uuid4().hex[:12]}"
            text = re.sub(rf"([\"']){re.escape(name)}\1", rf"\g<1>{self.names[key]}\1", text)
        return URL.sub(lambda m: f"{m[1]}://{self._unique(m[1], m[2])}", text)

    def paths(self) -> list[Path]:
        """The files a page's servers might leave: socket files and shm segments."""
        found = []
        for key, unique in self.names.items():
            if key.startswith("name:"):
                found.append(Path("/dev/shm") / f"transport-{unique}")
            elif key.startswith("path:"):
                found.append(Path(unique))
            elif key.startswith("channel:"):
                found += [Path(f"/dev/shm/transport-{kind}-{unique}") for kind in CHANNEL_KINDS]
        return found


CHANNEL_KINDS = ("ring", "board", "control")
RENAMERS: dict[Path, Renamer] = {}


def renamer(page: Path) -> Renamer:
    """The page's one renamer (shared by its Python, shell and Node blocks and its markers)."""
    return RENAMERS.setdefault(page, Renamer())


class Background:
    """A server process of a page: started, waited for ``ready URL``, stopped with SIGTERM."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str]) -> None:
        self.command = command
        self.proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        line = self._first_line(timeout=60.0)
        if not line.startswith("ready "):
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
            err = self.proc.stderr.read()[-2000:] if self.proc.stderr is not None else ""
            self.stop()
            raise AssertionError(f"{command!r} did not start: {line!r} {err}")

    def _first_line(self, timeout: float) -> str:
        """The server's first stdout line, or "" if it prints none within ``timeout``."""
        lines: queue.Queue[str] = queue.Queue()
        stdout = self.proc.stdout
        assert stdout is not None
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        try:
            return lines.get(timeout=timeout).strip()
        except queue.Empty:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


HELPER = '''"""What a hidden prelude may use (tests/test_docs_examples.py writes this module)."""
import os
import signal
import threading


def stop_when_serving(url, timeout=60.0):
    """SIGTERM this process once a server answers at ``url``: an example that calls the blocking
    ``transport.serve(...)`` then stops the way a user's Ctrl-C would, and cleans up."""

    def watch():
        import transport

        with transport.connect(url, timeout=timeout):
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()
'''


class PageRun:
    """The state of the page whose blocks are running: folder, URL names, servers."""

    def __init__(self, page: Path) -> None:
        self.page = page
        self.dir = Path(tempfile.mkdtemp(prefix="docs-test-"))
        self.rename = renamer(page)
        self.servers: dict[str, Background] = {}
        self.env = dict(os.environ)
        self.env["PATH"] = f"{VENV_BIN}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(self.dir), str(ROOT), self.env.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep)
        self.env["DOCS_TEST_REPO"] = str(ROOT)
        # one math thread per example (torch, BLAS): CI has 2 cores, oversubscribing them is slow
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            self.env.setdefault(name, "1")
        (self.dir / "docs_test.py").write_text(HELPER)

    def server(self, spec: str) -> None:
        """``transport-serve URL ARGS`` for this page: reused while the next block asks for the
        same; a server at that URL with other arguments is stopped first."""
        self.background(f"transport-serve {self.rename(spec)}")

    def background(self, command: str) -> None:
        match = URL.search(command)
        key = match[0] if match else command
        running = self.servers.get(key)
        if running is not None and running.command != command:
            running.stop()
            running = None
        if running is None:
            self.servers[key] = Background(command, self.dir, self.env)

    def close(self) -> list[str]:
        """Stops the servers; returns what they left behind (socket files, shm segments)."""
        for server in self.servers.values():
            server.stop()
        leftovers = []
        for path in self.rename.paths():
            if path.exists():
                leftovers.append(str(path))
                path.unlink()
        shutil.rmtree(self.dir, ignore_errors=True)
        return leftovers


class Pages:
    """Runs pages one at a time: a new page's first block closes the previous page's servers."""

    def __init__(self) -> None:
        self.current: PageRun | None = None

    def enter(self, page: Path) -> PageRun:
        if self.current is not None and self.current.page != page:
            self.close()
        if self.current is None:
            self.current = PageRun(page)
        return self.current

    def close(self) -> None:
        if self.current is not None:
            run, self.current = self.current, None
            leftovers = run.close()
            assert not leftovers, f"{run.page}: examples left {leftovers}"


@pytest.fixture(scope="module")
def pages() -> Iterator[Pages]:
    state = Pages()
    yield state
    state.close()


def _tail(out: str) -> str:
    return out[-3000:]


def _run(args: list[str], run: PageRun, timeout: float, what: str) -> None:
    try:
        done = subprocess.run(
            args, cwd=run.dir, env=run.env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        raise AssertionError(f"{what}: did not finish within {timeout} s\n{_tail(out)}") from None
    assert done.returncode == 0, (
        f"{what}: exit {done.returncode}\n{_tail(done.stdout + done.stderr)}"
    )


def _strip_comment(line: str) -> str:
    """``line`` without its ``# comment`` (a ``#`` at the start or after a space, unquoted)."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _shell_lines(code: str) -> list[str]:
    """Commands of a sh/console block: continuations joined, prompts and comments dropped;
    in a ``console`` block only ``$ `` lines are commands (the rest is output)."""
    console = any(line.startswith("$ ") for line in code.splitlines())
    commands: list[str] = []
    for line in code.replace("\\\n", " ").splitlines():
        if console:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        command = _strip_comment(line).strip()
        if command:
            commands.append(command)
    return commands


# -- TypeScript and JavaScript: one project, one tsc run for every ts block ----------------------


def _wrapped(code: str) -> str:
    """Top-level ``import`` statements stay at the top; the rest runs in an async main (a block
    may ``await``), which exits 0 when it returns and 1 with the error when it throws."""
    imports: list[str] = []
    body: list[str] = []
    in_import = False
    for line in code.splitlines():
        if in_import or re.match(r"import\s", line):
            imports.append(line)
            in_import = not line.rstrip().endswith(";")
        else:
            body.append(line)
    return (
        "\n".join(imports)
        + "\nasync function main(): Promise<void> {\n"
        + "\n".join(body)
        + "\n}\nmain().then(() => process.exit(0), (error) => { console.error(error);"
        " process.exit(1); });\n"
    )


@dataclass
class NodeProject:
    root: Path
    errors: dict[str, list[str]]


def _node_name(block: Block, ext: str) -> str:
    return f"{block.page.stem.replace('-', '_')}_{block.line}.{ext}"


@pytest.fixture(scope="module")
def node_project() -> Iterator[NodeProject]:
    """Every ts and js block of every page in one temp project that has node_bridge installed
    by name (a link, as ``npm install path/to/node_bridge`` makes); ts compiled in one tsc run."""
    if shutil.which("node") is None or not (BRIDGE / "dist" / "index.js").is_file():
        pytest.skip("node_bridge is not built (./dev setup)")
    root = Path(tempfile.mkdtemp(prefix="docs-test-node-"))
    (root / "node_modules" / "@transport").mkdir(parents=True)
    (root / "node_modules" / "@transport" / "node-bridge").symlink_to(BRIDGE)
    (root / "package.json").write_text('{"name": "docs-examples", "private": true}\n')
    ts_files = []
    for block in ALL_BLOCKS:
        if block.lang not in ("ts", "js") or block.skip:
            continue
        code = renamer(block.page)(block.prelude + block.code, block.names)
        if block.lang == "ts":
            name = _node_name(block, "ts")
            (root / name).write_text(_wrapped(code))
            ts_files.append(name)
        else:
            (root / _node_name(block, "js")).write_text(code)  # as written: CommonJS
    errors: dict[str, list[str]] = {}
    if ts_files:
        tsc = BRIDGE / "node_modules" / "typescript" / "bin" / "tsc"
        args = ["--strict", "--module", "node16", "--moduleResolution", "node16"]
        args += ["--target", "ES2022", "--skipLibCheck", "--outDir", "."]
        args += ["--typeRoots", str(BRIDGE / "node_modules" / "@types"), "--types", "node"]
        done = subprocess.run(
            ["node", str(tsc), *args, *ts_files],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=300,
        )
        for line in done.stdout.splitlines():
            match = re.match(r"(\w+\.ts)\(", line)
            if match:
                errors.setdefault(match[1], []).append(line)
    try:
        yield NodeProject(root, errors)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- the tests ------------------------------------------------------------------------------------


def test_markers_parse_and_every_page_is_covered() -> None:
    """Every page parses (markers known, each before a fence); shm.md and probe.md included."""
    covered = {block.page.name for block in ALL_BLOCKS}
    assert {"README.md", "client.md", "shm.md", "node.md", "channels.md"} <= covered, covered


def test_the_url_renamer_keeps_a_page_consistent() -> None:
    rename = Renamer()
    text = rename('transport-serve "shm://walk?num_envs=8" ; connect("shm://walk") auto://walk')
    names = re.findall(r"(?:shm|auto)://([\w-]+)", text)
    assert len(set(names)) == 1 and names[0].startswith("docs-"), text
    assert "?num_envs=8" in text
    tcp = rename("zmq+tcp://127.0.0.1:5555 then http://127.0.0.1:5555/x")
    assert len(set(re.findall(r"127\.0\.0\.1:(\d+)", tcp))) == 1 and "5555" not in tcp


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[block.id for block in ALL_BLOCKS])
def test_example_runs(block: Block, pages: Pages, request: pytest.FixtureRequest) -> None:
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    run = pages.enter(block.page)
    for spec in block.servers:
        run.server(spec)
    what = f"{block.id} ({block.lang})"
    if block.file is not None:
        (run.dir / block.file).write_text(run.rename(block.prelude + block.code, block.names))
        return
    if block.lang == "python":
        script = run.dir / f"block_{block.line}.py"
        script.write_text(run.rename(block.prelude + block.code, block.names))
        _run([sys.executable, str(script)], run, block.timeout, what)
    elif block.lang == "sh":
        for command in _shell_lines(run.rename(block.prelude + block.code, block.names)):
            if command.endswith("&") and not command.endswith("&&"):
                run.background(command[:-1].rstrip())
            else:
                _run(["bash", "-c", command], run, block.timeout, f"{what}: {command}")
    else:
        project: NodeProject = request.getfixturevalue("node_project")
        if block.lang == "ts":
            name = _node_name(block, "ts")
            assert name not in project.errors, f"{what}: tsc:\n" + "\n".join(project.errors[name])
            _run(["node", str(project.root / _node_name(block, "js"))], run, block.timeout, what)
        else:
            _run(["node", str(project.root / _node_name(block, "js"))], run, block.timeout, what)


def test_the_readme_opens_with_a_quickstart_of_at_most_15_lines() -> None:
    """Issue 26 item 3: an env, a server, a trainer over shm, in at most 15 lines of code, before
    anything else; the "What is here" table has one header and the library row links the client
    page."""
    text = (ROOT / "README.md").read_text()
    sections = text.split("\n## ")
    quickstart = sections[1]
    assert quickstart.startswith("Quickstart"), sections[1][:40]
    code = [b for b in parse_page(ROOT / "README.md") if f"\n{b.code}" in quickstart]
    lines = sum(len(b.code.strip("\n").splitlines()) for b in code)
    assert {b.lang for b in code} == {"python", "sh"} and lines <= 15, lines
    assert "transport-serve" in quickstart and "shm://" in quickstart
    here = next(s for s in sections if s.startswith("What is here"))
    assert here.count("| path | what |") == 1
    library = next(line for line in text.splitlines() if line.startswith("transport.connect(url)"))
    assert "docs/client.md" in library, library


def untagged_blocks(page: Path) -> list[str]:
    """The bodies of a page's fences with no language tag (synopses, diagrams, layouts)."""
    bodies: list[str] = []
    body: list[str] | None = None
    tagged = False
    for line in page.read_text().splitlines():
        if line.strip().startswith("```"):
            if body is None:
                body, tagged = [], line.strip() != "```"
            else:
                if not tagged:
                    bodies.append("\n".join(body) + "\n")
                body = None
        elif body is not None:
            body.append(line)
    return bodies


TOOL = re.compile(r"^(?:\$ )?(?:\S+=\S+ )*(transport-[a-z-]+)\b", re.M)


def test_every_tool_a_page_names_in_a_command_block_exists() -> None:
    """Untagged blocks are synopses, not run; the ``transport-*`` commands they show must still
    be real tools: each answers ``--help`` with exit 0."""
    tools: set[str] = set()
    for page in PAGES:
        for fence in untagged_blocks(page):
            tools.update(TOOL.findall(fence))
    assert "transport-serve" in tools, tools
    for tool in sorted(tools):
        path = VENV_BIN / tool
        if tool == "transport-serve-node":  # the Node package's bin (npx), not a console script
            path = BRIDGE / "bin" / "transport-serve-node.js"
        assert path.is_file(), f"{tool}: named in the docs, not installed"
        done = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{tool} --help: {done.stderr[-500:]}"


def test_marker_syntax(tmp_path: Path) -> None:
    """The markers of docs/testing.md: skip needs a reason, unknown directives and markers that
    precede no fence are errors, several markers stack on one block."""
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- docs-test: skip needs a GPU -->\n```python\nimport torch\n```\n\n"
        "<!-- docs-test: server unix:///tmp/a.sock --env pac -->\n<!-- docs-test: prelude\n"
        "x = 1\n-->\n<!-- docs-test: timeout 5 -->\n```python\nprint(x)\n```\n"
    )
    skipped, served = parse_page(page)
    assert skipped.skip == "needs a GPU" and skipped.line == 2
    assert served.servers == ["unix:///tmp/a.sock --env pac"] and served.prelude == "x = 1\n"
    assert served.timeout == 5.0 and served.skip is None
    for bad in (
        "<!-- docs-test: skip -->\n```python\n```\n",
        "<!-- docs-test: frobnicate -->\n```python\n```\n",
        "<!-- docs-test: skip why -->\nprose\n```python\n```\n",
    ):
        page.write_text(bad)
        with pytest.raises(MarkerError):
            parse_page(page)
