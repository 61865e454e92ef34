"""The built wheel installs the rooms under the quail namespace and works outside the source tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_installs_and_runs(tmp_path):
    ours = not (ROOT / "build").exists()  # setuptools builds in the tree: a build/ folder it makes goes after
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
                        str(ROOT)], check=True)
    finally:
        if ours:
            shutil.rmtree(ROOT / "build", ignore_errors=True)
    (wheel,) = (tmp_path / "dist").glob("quail_server-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    missing = [module for module in _wheel_paths() + ["quail/planner/substrait/quail_ai_functions.yaml"]
               if module not in names]
    assert not missing, f"modules of the tree left out of the wheel: {missing}"
    stale = [n for n in names if n.endswith(".py") and n not in _wheel_paths()]
    assert not stale, f"modules in the wheel the tree no longer has (a stale build/ folder?): {stale}"
    assert not any(n.startswith(("server/", "engine/", "planner/", "tests/")) for n in names)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "quail = quail.cli:main" in entry_points

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True)
    out = subprocess.run(
        [sys.executable, "-c", "import quail, quail.server.app, quail.session, quail.engine.runtime.loading; print(quail.__file__)"],
        cwd=tmp_path, env={"PYTHONPATH": str(target), "PATH": ""}, capture_output=True, text=True, check=True)
    assert out.stdout.strip().startswith(str(target))
    help_text = subprocess.run([sys.executable, "-m", "quail.cli", "serve", "--help"], cwd=tmp_path,
                               env={"PYTHONPATH": str(target)}, capture_output=True, text=True, check=True)
    assert "--data-dir" in help_text.stdout


def _wheel_paths() -> list[str]:
    """Where each Python module of the tree lands in the wheel (a room's folder is quail/<room>/)."""
    paths = [str(path.relative_to(ROOT)) for path in (ROOT / "quail").rglob("*.py")]
    for room in ("server", "planner", "engine", "clients"):
        paths += [f"quail/{room}/{path.relative_to(ROOT / room)}" for path in (ROOT / room).rglob("*.py")]
    return [p for p in paths if "__pycache__" not in p]
