"""The backend contract (transport.testing) over every scheme x server language: pac_env with
every check; tetris and mahjong_env with the layout-dependent checks over unix and shm.

Real server processes (``transport-serve URL --env contract --schema NAME``), shared by the
checks of one (scheme, language, schema) and stopped when the run moves on; the checks that
stop, kill or freeze a server get their own. GAPS below is the one table of declared gaps:
each runs as a strict xfail, so a gap that closes fails the run until its entry is removed.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import types
from collections.abc import Iterator

import numpy as np
import pytest

import transport
import transport.testing
from transport.codec import Schema
from transport.testing import (
    Case,
    NotApplicable,
    PoolsByCase,
    RunningServer,
    ServerOptions,
    contract_cases,
    contract_checks,
    run_check,
    schema_named,
    unique_url,
    unused_gaps,
)
from transport.testing.contract_env import ContractEnv

from .servers import ROOT, require_lang

SCHEMES = ["unix", "http", "zmq+ipc", "zmq+tcp", "shm"]
SCHEMAS = ["pac_env", "tetris", "mahjong_env"]
TARGETS = [(scheme, lang) for scheme in SCHEMES for lang in ("python", "node")]
LAYOUT_TARGETS = [(scheme, lang) for scheme in ("unix", "shm") for lang in ("python", "node")]
"""Where the other schemas run: one socket backend and shm, both server languages. A socket
backend moves opaque bodies (the layout is the runtime's and the codec's, the same code over
every scheme), so pac_env (the largest records) over every scheme proves the framing; shm's
slots and final areas are laid out from the schema, so shm runs every schema."""
LAYOUT_CHECKS = [name for name, check in contract_checks().items() if check.per_schema]

GAPS: dict[tuple[str, ...], str] = {}
"""(scheme, server language, schema, check) -> why it fails today ("*" matches anything).
Empty: every backend passes every check in both server languages over every schema."""

CASES = contract_cases(TARGETS, SCHEMAS[:1], GAPS)
CASES += contract_cases(LAYOUT_TARGETS, SCHEMAS[1:], GAPS, checks=LAYOUT_CHECKS)


@pytest.fixture(scope="module")
def pools() -> Iterator[PoolsByCase]:
    holder = PoolsByCase()
    yield holder
    holder.close()


@pytest.mark.parametrize("case", CASES)
def test_contract(case: Case, pools: PoolsByCase) -> None:
    require_lang(case.target[1])
    pool = pools.get(case)
    try:
        run_check(case.check, pool, schema_named(case.schema))
    except NotApplicable as exc:
        pytest.skip(f"not applicable: {exc}")
    except BaseException:
        print(pool.logs())  # shown with the failure: the servers' own warnings
        raise


def test_every_gap_names_a_cell() -> None:
    assert unused_gaps(GAPS, CASES) == []


NODE_TRACE = r"""
const { ContractEnv } = require("./node_bridge/dist/envs/contract.js");
const { SCHEMAS } = require("./node_bridge/dist/generated/index.js");
const plan = JSON.parse(require("fs").readFileSync(0, "utf8"));
const out = {};
for (const [name, ops] of Object.entries(plan)) {
  const env = new ContractEnv(SCHEMAS[name]);
  out[name] = ops.map(([op, arg]) => {
    try {
      const r = op === "reset" ? env.reset(arg === null ? undefined : BigInt(arg)) : env.step(arg);
      return Buffer.from(env.codec.encode(r)).toString("hex");
    } catch (error) {
      return "error";
    }
  });
}
process.stdout.write(JSON.stringify(out));
"""


def test_python_and_node_contract_envs_write_identical_bytes() -> None:
    require_lang("node")
    ops: list[tuple[str, str | int | None]] = [("reset", "7")]
    ops += [("step", a) for a in (0, 2, 1, 3, 5, 0, 0, 0, 0)]
    ops += [("reset", None), ("step", 4), ("reset", str(2**64 - 1)), ("step", 0), ("step", 0)]
    ops += [("reset", None)] + [("step", 0)] * 6 + [("reset", "0"), ("reset", None)]
    plan = {name: ops for name in SCHEMAS}
    done = subprocess.run(
        ["node", "-e", NODE_TRACE],
        input=json.dumps(plan),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    node = json.loads(done.stdout)
    for name in SCHEMAS:
        env = ContractEnv(schema_named(name))
        for k, (op, arg) in enumerate(ops):
            try:
                if op == "reset":
                    record = env.reset(None if arg is None else int(arg))
                else:
                    assert isinstance(arg, int)
                    record = env.step(arg)
                got = record.tobytes().hex()
            except Exception:
                got = "error"
            assert got == node[name][k], f"{name}: operation {k} ({op} {arg}) differs"


# -- the checks catch broken servers ---------------------------------------------------------


class InProcessServers:
    """A ServerFactory serving a given env class in this process (no signals: the dedicated
    checks are not applicable), so a mutant env can be put behind a real server."""

    def __init__(self, env_class: type[ContractEnv]) -> None:
        self.env_class = env_class
        self.servers: list[transport.Server] = []

    def __call__(self, schema: Schema, num_envs: int, options: ServerOptions) -> RunningServer:
        if options.dedicated:
            raise NotApplicable("an in-process server cannot be signalled")
        server = transport.Server(
            functools.partial(self.env_class, schema),
            unique_url("unix"),
            schema=schema,
            num_envs=num_envs,
            env_name="contract",
            seed=options.seed,
            max_body=options.max_body,
        ).start()
        self.servers.append(server)
        return InProcessServer(server)

    def close(self) -> None:
        for server in self.servers:
            server.close()


class InProcessServer:
    def __init__(self, server: transport.Server) -> None:
        self.server = server
        self.url = server.bound_url
        self.pid = os.getpid()

    def wait(self, timeout: float) -> int:
        raise NotApplicable("in process")

    def stop(self) -> int:
        self.server.close()
        return 0

    def kill(self) -> None:
        self.server.close()

    def leftovers(self) -> list[str]:
        return []


class IgnoresSeeds(ContractEnv):
    def reset(self, seed: int | None = None) -> np.ndarray:
        return super().reset(None)


class StepsTwice(ContractEnv):
    def step(self, action: int) -> np.ndarray:
        super().step(action)
        return super().step(action)


class NeverEnds(ContractEnv):
    def episode_end(self) -> tuple[bool, bool]:
        return False, False


class MasksNothing(ContractEnv):
    def _result(self) -> np.ndarray:
        record = super()._result()
        record["action_mask"] = 1
        return record


@pytest.mark.parametrize(
    ("mutant", "check"),
    [
        (IgnoresSeeds, "reset_seeds"),
        (StepsTwice, "step_one_env"),
        (StepsTwice, "step_batch"),
        (NeverEnds, "step_one_env"),
        (NeverEnds, "autoreset_same_step"),
        (NeverEnds, "autoreset_next_step"),
        (MasksNothing, "refused_actions"),
    ],
)
def test_a_check_fails_on_a_server_that_breaks_its_rule(
    mutant: type[ContractEnv], check: str
) -> None:
    schema = schema_named("pac_env")
    honest = InProcessServers(ContractEnv)
    broken = InProcessServers(mutant)
    try:
        run_check(check, honest, schema)  # the same check passes on the honest env
        with pytest.raises(AssertionError):
            run_check(check, broken, schema)
    finally:
        honest.close()
        broken.close()


def test_public_names() -> None:
    """``__all__`` lists every public name the package binds except its submodules (the check
    modules are imported to register their checks)."""
    assert sorted(transport.testing.__all__) == sorted(
        name
        for name in dir(transport.testing)
        if not name.startswith("_")
        and name.isidentifier()
        and not isinstance(getattr(transport.testing, name), types.ModuleType)
    )
