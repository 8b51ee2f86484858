"""The probe's `transport_commit` is this checkout's, never the commit of a repository the
installed package sits in (a project's .venv inside its git repository: exploration 23)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from transport.probe import machine


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
def test_an_installed_package_inside_another_repository_names_no_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=30)
    site = tmp_path / ".venv" / "lib" / "site-packages"
    (site / "transport").mkdir(parents=True)
    (tmp_path / "app.py").write_text("")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=a", "-c", "user.email=a@b"]
    subprocess.run([*git, "add", "app.py"], check=True, timeout=30)
    subprocess.run([*git, "commit", "-qm", "app"], check=True, timeout=30)
    monkeypatch.setattr(machine, "ROOT", site)
    assert machine._git_commit() is None


def test_the_checkout_names_its_commit() -> None:
    if not (machine.ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    commit = machine._git_commit()
    assert commit is not None and len(commit.split("+")[0]) == 12
