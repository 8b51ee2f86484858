"""Where `transport-serve --lang node` finds the Node server: this checkout's build, the npm
package installed in the current folder or above it (a project using both packages), or
$TRANSPORT_NODE_SERVER; outside a checkout it only looked in the site-packages folder and said
to run ./dev setup (exploration 23)."""

from __future__ import annotations

from pathlib import Path

import pytest

from transport.tools import serve_cli

from .servers import ROOT


@pytest.fixture()
def no_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """serve_cli as installed outside a checkout: no node_bridge beside the package."""
    site = tmp_path / "site-packages" / "transport" / "tools"
    site.mkdir(parents=True)
    monkeypatch.setattr(serve_cli, "__file__", str(site / "serve_cli.py"))
    monkeypatch.delenv(serve_cli.NODE_SERVER_ENV, raising=False)
    return tmp_path


def test_the_checkout_build_first() -> None:
    assert serve_cli.node_server_script() == ROOT / "node_bridge" / "dist" / "cli" / "serve.js"


def test_an_npm_install_in_this_folder_or_above(
    no_checkout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = no_checkout / "project"
    package = project / "node_modules" / "@transport" / "node-bridge" / "dist" / "cli"
    package.mkdir(parents=True)
    (package / "serve.js").write_text("")
    (project / "src").mkdir()
    monkeypatch.chdir(project / "src")
    assert serve_cli.node_server_script() == package / "serve.js"


def test_the_environment_names_it(no_checkout: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(serve_cli.NODE_SERVER_ENV, "/opt/bridge/dist/cli/serve.js")
    assert serve_cli.node_server_script() == Path("/opt/bridge/dist/cli/serve.js")


def test_none_found_says_how(
    no_checkout: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(no_checkout)
    assert serve_cli.main(["unix:///tmp/nowhere.sock", "--lang", "node"]) == 1
    error = capsys.readouterr().err
    assert "npm install the @transport/node-bridge package" in error
    assert serve_cli.NODE_SERVER_ENV in error
