"""Where a result came from: the commit of the code that ran and the device it ran on (imports nothing heavy)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def git_commit() -> str:
    """The commit of the code that runs: QUAIL_GIT_COMMIT where set (bench/gpu_run.sh sets the commit the wheels
    were built from), else the checkout's HEAD, else 'unknown'."""
    if os.environ.get("QUAIL_GIT_COMMIT"):
        return os.environ["QUAIL_GIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(0)
    return f"CPU ({platform.processor() or platform.machine()})"
