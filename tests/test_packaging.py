"""The built wheel installs the rooms under the quail namespace and works outside the source tree."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_installs_and_runs(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(ROOT)],
                   check=True)
    (wheel,) = (tmp_path / "dist").glob("quail_server-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for module in ["quail/cli.py", "quail/server/app.py", "quail/planner/planner.py", "quail/engine/model.py",
                   "quail/clients/demo.py", "quail/planner/substrait/quail_ai_functions.yaml"]:
        assert module in names
    assert not any(n.startswith(("server/", "engine/", "planner/", "tests/")) for n in names)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "quail = quail.cli:main" in entry_points

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True)
    out = subprocess.run(
        [sys.executable, "-c", "import quail, quail.server.app, quail.engine.runtime.loading; print(quail.__file__)"],
        cwd=tmp_path, env={"PYTHONPATH": str(target), "PATH": ""}, capture_output=True, text=True, check=True)
    assert out.stdout.strip().startswith(str(target))
    help_text = subprocess.run([sys.executable, "-m", "quail.cli", "serve", "--help"], cwd=tmp_path,
                               env={"PYTHONPATH": str(target)}, capture_output=True, text=True, check=True)
    assert "--data-dir" in help_text.stdout
