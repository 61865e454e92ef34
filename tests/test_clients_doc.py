"""docs/clients.md's Python snippets run against a real server as written (its address swapped in), so the
page's working snippets keep working."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

import quail

PAGE = Path(__file__).resolve().parents[1] / "docs" / "clients.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
NOTES = pa.table({"id": [1, 2, 3], "stars": [1, 4, 5], "body": ["Cold soup.", "Kind staff.", "A lovely view."]})


@pytest.fixture(scope="module")
def address(server):
    with quail.connect(server.uri) as conn, conn.cursor() as cur:
        cur.adbc_ingest("notes", NOTES, mode="replace")
    return server.uri.removeprefix("grpc://")


def test_the_page_has_its_snippets():
    assert len(SNIPPETS) >= 5


@pytest.mark.parametrize("code", [s for s in SNIPPETS if "password=" not in s],
                         ids=lambda code: code.splitlines()[0][:40])
def test_a_snippet_runs_as_written(address, code):
    """Each snippet without a login, on the test server; `frame` stands for the reader's own DataFrame."""
    exec(compile(code.replace("127.0.0.1:8815", address), str(PAGE), "exec"),
         {"frame": pd.DataFrame({"id": [7], "body": ["Fine."]}), "print": lambda *args: None})
