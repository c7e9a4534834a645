"""The package people install: its distribution name is free on the package index ("dispatch" there is
an unrelated project), the import package stays ``dispatch``, and a wheel built from this tree installs
into a fresh virtualenv with working console scripts.

The install is offline (``--no-index``) from the built wheel and its dependencies downloaded as wheels
beforehand (``pip download``, which pip's own HTTP cache makes cheap the second time): nothing of this
checkout or of the test's virtualenv leaks into the fresh one, so a module missing from the wheel, or a
dependency missing from its metadata, fails the test.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

from dispatch.cli.clusters import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[2]


def test_the_distribution_is_named_as_the_cli_says() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION == "dispatch-train"
    assert project["scripts"] == {
        "dispatch": "dispatch.cli:main",
        "dispatch-admission": "dispatch_kubeflow.admission:main",
    }


def test_no_file_says_to_install_the_unrelated_dispatch() -> None:
    """Every install line names the distribution: the bare name would install someone else's package
    (and its extras, named with brackets, likewise)."""
    wrong = re.compile(r"pip install +['\"]?" + "dispatch" + r"(?![-\w])")
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    offenders = [
        f"{name}:{n}"
        for name in files
        if (ROOT / name).is_file() and not name.endswith((".png", ".whl"))
        for n, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1)
        if wrong.search(line)
    ]
    assert offenders == []


@pytest.mark.timeout(600)
def test_the_wheel_installs_in_a_fresh_venv_with_working_commands(tmp_path: Path) -> None:
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    dist, deps = tmp_path / "dist", tmp_path / "deps"
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", dist, ROOT], check=True)
    (wheel,) = dist.glob("*.whl")
    assert wheel.name.startswith("dispatch_train-")
    subprocess.run([*pip, "download", "--only-binary", ":all:", "-d", deps, wheel], check=True)

    fresh = tmp_path / "fresh"
    venv.create(fresh, with_pip=True)
    py = fresh / "bin" / "python"
    subprocess.run(
        [py, "-m", "pip", "-q", "install", "--no-index", "-f", dist, "-f", deps, DISTRIBUTION],
        check=True,
        cwd=tmp_path,  # not the checkout: nothing of it may be imported by accident
    )
    for script in ("dispatch", "dispatch-admission"):
        shown = subprocess.run(
            [fresh / "bin" / script, "--help"], capture_output=True, text=True, check=False, cwd=tmp_path
        )
        assert shown.returncode == 0, shown.stderr
        assert "usage:" in shown.stdout.lower()
    version = subprocess.run(
        [fresh / "bin" / "dispatch", "version"], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert version.stdout.startswith("dispatch 0.") and DISTRIBUTION in version.stdout
