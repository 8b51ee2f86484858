"""Schema discovery (issue 12 item 8): a client with no schema file gets the server's compiled
schema in the handshake, both client languages, every backend; pinned mismatches name both
schemas. The Python client against both server languages is in the contract suite
(transport/testing/checks_discovery.py); here: the Node client, connect_many, the adapters, and
the refusal of an IR that does not hash to the announced fingerprint."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import transport
from transport.client import Client
from transport.errors import FingerprintMismatchError, ProtocolError
from transport.generated import pac_env, tetris
from transport.protocol import schema_from_ir_text, schema_ir_text

from .servers import ROOT, ServerProcess, require_lang, unique_url

SCHEMES = ["unix", "http", "zmq+ipc", "zmq+tcp", "shm"]
NODE_CLIENT = """
const { connect, pac_env } = require(process.argv[2]);
(async () => {
  const url = process.argv[3];
  const out = {};
  const client = await connect(url, { timeoutMs: 10000 });
  try {
    out.name = client.schema.name;
    out.fingerprint = client.schema.fingerprintHex;
    const reset = client.reset(5, { copy: true });
    const first = await reset;
    out.observation = Array.from(first.observation);
    out.info = client.serverInfo ?? null;
  } finally {
    await client.close();
  }
  try {
    const pinned = await connect(url, { schema: pac_env.SCHEMA, timeoutMs: 10000 });
    await pinned.close();
    out.mismatch = null;
  } catch (error) {
    out.mismatch = `${error.constructor.name}: ${error.message}`;
  }
  process.stdout.write(JSON.stringify(out));
})().catch((error) => { process.stderr.write(String(error.stack)); process.exit(1); });
"""


def contract_server(scheme: str, lang: str = "python", schema: str = "tetris") -> ServerProcess:
    url = unique_url(scheme) + ("?num_envs=1" if scheme == "shm" else "")
    return ServerProcess(url, env="contract", lang=lang, extra=["--schema", schema, "--seed", "3"])


def python_reset(url: str) -> tuple[str, np.ndarray]:
    with transport.connect(url, timeout=10) as client:
        observation = client.reset(5, copy=True).observation
        return client.schema.name, np.asarray(observation, dtype=np.float64).reshape(-1)


@pytest.mark.parametrize("lang", ["python", "node"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_node_client_discovers_the_schema(scheme: str, lang: str, tmp_path: Path) -> None:
    """The Node client without a schema, against a tetris server of either language: the
    discovered schema, a reset equal to the Python client's, and a pinned pac_env client
    refused with both schemas named."""
    require_lang("node")
    script = tmp_path / "client.js"
    script.write_text(NODE_CLIENT)
    with contract_server(scheme, lang) as server:
        done = subprocess.run(
            ["node", str(script), str(ROOT / "node_bridge" / "dist" / "index.js"), server.url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        name, observation = python_reset(server.url)
    assert out["name"] == name == "tetris"
    assert out["fingerprint"] == tetris.SCHEMA.ir.fingerprint_hex
    np.testing.assert_array_equal(np.asarray(out["observation"]), observation)
    mismatch = out["mismatch"]
    assert mismatch is not None and mismatch.startswith("FingerprintMismatchError"), mismatch
    for part in (
        "tetris",
        tetris.SCHEMA.ir.fingerprint_hex,
        "pac_env",
        pac_env.SCHEMA.ir.fingerprint_hex,
    ):
        assert part in mismatch, f"{part} not named in {mismatch!r}"


def test_connect_many_and_adapters_discover(tmp_path: Path) -> None:
    """connect_many, gymnasium's RemoteEnv and SB3's RemoteVecEnv with no schema: the spaces
    and results of the server's schema (tetris, over a Node server)."""
    from transport.gym import RemoteEnv
    from transport.sb3 import RemoteVecEnv

    require_lang("node")
    with contract_server("unix", "node") as one, contract_server("zmq+ipc", "node") as two:
        with transport.connect_many([one.url, two.url], timeout=10) as multi:
            assert multi.schema.fingerprint == tetris.SCHEMA.fingerprint
            assert multi.reset(5).observation.shape[0] == 2
        env = RemoteEnv(one.url)
        try:
            assert env.client.schema.name == "tetris"
            observation, _ = env.reset(seed=5)
            assert observation.shape == env.observation_space.shape
        finally:
            env.close()
        vec = RemoteVecEnv(two.url)
        try:
            assert vec.client.schema.name == "tetris"
            first = vec.reset()
            assert isinstance(first, np.ndarray) and first.shape[0] == vec.num_envs
        finally:
            vec.close()


def test_pinned_schema_still_pins() -> None:
    """``schema=`` pins: the right one connects (no discovery), the wrong one is refused naming
    both schemas and the URL."""
    with contract_server("unix") as server:
        with transport.connect(server.url, tetris.SCHEMA, timeout=10) as client:
            assert client.schema is tetris.SCHEMA
        with pytest.raises(FingerprintMismatchError) as info:
            transport.connect(server.url, pac_env.SCHEMA, timeout=10)
    text = str(info.value)
    assert server.url in text
    for part in ("tetris", "pac_env", f"{tetris.FINGERPRINT:016x}", f"{pac_env.FINGERPRINT:016x}"):
        assert part in text, f"{part} not named in {text!r}"


def test_an_ir_that_does_not_hash_to_the_announced_fingerprint_is_refused() -> None:
    text = schema_ir_text(tetris.SCHEMA)
    assert schema_from_ir_text(text, tetris.FINGERPRINT, peer="p").fingerprint == tetris.FINGERPRINT
    with pytest.raises(FingerprintMismatchError, match="announced fingerprint"):
        schema_from_ir_text(text, pac_env.FINGERPRINT, peer="p")
    edited = json.loads(text)
    edited["structs"]["StepResult"]["size"] += 4  # the embedded fingerprint no longer matches
    with pytest.raises(ProtocolError, match="does not load"):
        schema_from_ir_text(json.dumps(edited), tetris.FINGERPRINT, peer="p")
    with pytest.raises(ProtocolError, match="no schema IR"):
        schema_from_ir_text(None, tetris.FINGERPRINT, peer="p")


def test_discovering_client_is_a_plain_client() -> None:
    with contract_server("http") as server, transport.connect(server.url, timeout=10) as client:
        assert isinstance(client, Client)
        assert "schema_ir" not in client.server_info and "schema_name" not in client.server_info
        assert client.health() is True


def test_auto_url_discovers_through_the_backend_it_picks() -> None:
    """auto://NAME without a schema: the shm candidate reads the region's schema (tetris),
    not the reference one (before: it tried pac_env and skipped the region as a mismatch)."""
    url = unique_url("shm")
    with ServerProcess(url + "?num_envs=1", env="contract", extra=["--schema", "tetris"]):
        with transport.connect("auto://" + url.removeprefix("shm://"), timeout=10) as client:
            assert client.url.startswith("shm://")
            assert client.schema.name == "tetris"
            assert client.reset(3).observation.shape == (214,)
