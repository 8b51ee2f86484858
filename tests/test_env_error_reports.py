"""An env that raises is reported: the server logs its traceback (or JS stack) with the env and
the request once, and the client's EnvError carries the last frames (issue 15 item 3)."""

from __future__ import annotations

import pytest

import transport
from transport.errors import REMOTE_TRACEBACK_MARKER, EnvError
from transport.runtime.core import ENV_ERROR_TEXT_MAX, remote_traceback, with_traceback
from transport.schema.compiler import ERROR_TEXT_SIZE
from transport.testing import POISON_ACTION, schema_named

from .servers import ServerProcess, unique_url

SCHEMES = ["unix", "shm"]  # a stream ERROR text, and the shm slot's error text area


@pytest.mark.parametrize("lang", ["python", "node"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_env_error_is_logged_once_and_carries_its_traceback(scheme: str, lang: str) -> None:
    schema = schema_named("pac_env")
    server = ServerProcess(
        unique_url(scheme), env="contract", lang=lang, extra=["--schema", "pac_env"]
    )
    with server:
        with transport.connect(server.url, schema, timeout=20.0) as client:
            client.reset(5)
            with pytest.raises(EnvError) as caught:
                client.step(POISON_ACTION)
            client.step(0)  # the env was reset: the connection goes on
        error = caught.value
        assert error.env_id == 0
        assert error.text.startswith("env 0: ") and error.text.endswith("(the env was reset)")
        assert REMOTE_TRACEBACK_MARKER not in error.text
        assert "poison action" in error.remote_traceback, error.remote_traceback
        assert "contract" in error.remote_traceback  # a frame of the env's own file
        assert str(error).endswith(error.remote_traceback)
        assert len(str(error.text + REMOTE_TRACEBACK_MARKER + error.remote_traceback).encode()) <= (
            ENV_ERROR_TEXT_MAX
        )
        server.terminate()
        assert server.proc.stderr is not None
        log = server.proc.stderr.read()
    line = f"transport: env 0 raised during STEP action {POISON_ACTION} (the env was reset)"
    assert log.count(line) == 1, log
    after = log[log.index(line) :]
    assert "poison action" in after and "contract" in after, log  # the whole traceback / stack


def test_env_error_text_bound_is_the_shm_error_area() -> None:
    """Every backend carries the same text: the bound is the smallest carrier's."""
    assert ENV_ERROR_TEXT_MAX == ERROR_TEXT_SIZE


def test_with_traceback_keeps_the_last_lines_within_the_bound() -> None:
    trace = "".join(f"  File 'f{i}.py', line {i}, in g{i}\n    call{i}()\n" for i in range(200))
    trace += "ValueError: the last line"
    text = with_traceback("env 3: ValueError: boom (the env was reset)", trace)
    assert len(text.encode()) <= ENV_ERROR_TEXT_MAX
    message, _, kept = text.partition(REMOTE_TRACEBACK_MARKER)
    assert message == "env 3: ValueError: boom (the env was reset)"
    assert kept.startswith("  ...\n  File") and kept.endswith("ValueError: the last line")
    assert with_traceback("x" * 2000, trace) == "x" * 2000  # no room: the message alone
    assert with_traceback("m", "") == "m"


def test_remote_traceback_names_the_env_frames() -> None:
    def env_step() -> None:
        raise KeyError("missing")

    try:
        env_step()
    except KeyError as exc:
        trace = remote_traceback(exc)
    assert "in env_step" in trace and trace.endswith("KeyError: 'missing'")
    assert remote_traceback(ValueError("never raised")) == ""
