"""Flight sessions end when idle and are bounded in number, and a client sets its options again when a
session's cookie is lost on the way back (the ADBC session tests in test_server_adbc.py run the same code
over a real server)."""

from __future__ import annotations

import json

import pytest

from quail.remote import SESSION_TRIES, set_session_options
from quail.server.flight_messages import FLIGHT
from quail.server.session_options import COOKIE, Sessions


class _Call:
    """A call carrying a session cookie (or none); keeps the cookie the server sends back."""

    def __init__(self, session: str | None = None) -> None:
        self.session = session

    def invocation_metadata(self):
        return [("cookie", f"{COOKIE}={self.session}")] if self.session else []

    def send_initial_metadata(self, metadata) -> None:
        self.session = dict(metadata)["set-cookie"].partition("=")[2]


def _set(sessions: Sessions, call: _Call, dialect: str) -> None:
    entry = FLIGHT["SessionOptionEntry"](key="dialect", value=FLIGHT["SessionOptionValue"](string_value=dialect))
    sessions.set(call, FLIGHT["SetSessionOptionsRequest"](session_options=[entry]))


def test_sessions_end_when_idle_and_the_least_recently_used_go_past_the_bound():
    now = [0.0]
    sessions = Sessions({"dialect": "snowflake"}, {"dialect": ("snowflake", "duckdb")}, idle_s=60, max_count=3,
                        clock=lambda: now[0])
    calls = [_Call() for _ in range(3)]
    for call in calls:
        _set(sessions, call, "duckdb")
    assert all(sessions.known(call) == call.session for call in calls)
    now[0] = 50.0
    assert sessions.options(calls[0])["dialect"] == "duckdb"  # used: now the most recent
    _set(sessions, _Call(), "duckdb")  # a fourth: the least recently used (the second) ends
    assert sessions.known(calls[1]) is None and sessions.options(calls[1])["dialect"] == "snowflake"
    assert sessions.known(calls[0]) == calls[0].session
    now[0] = 105.0  # the third unused since 0 s, the first since 50 s
    assert sessions.known(calls[2]) is None and sessions.known(calls[0]) == calls[0].session
    stranger = _Call("made-up")
    _set(sessions, stranger, "duckdb")
    assert stranger.session != "made-up", "a cookie the server never gave opens a new session"


class _DroppingConnection:
    """An ADBC connection's session calls against Sessions, whose first `drops` session cookies are lost on
    the way back (as arrow-go's cookie middleware can lose one on a busy host)."""

    def __init__(self, sessions: Sessions, drops: int) -> None:
        self.sessions, self.drops, self.call = sessions, drops, _Call()
        self.adbc_connection = self

    def set_options(self, **options: str) -> None:
        before = self.call.session
        _set(self.sessions, self.call, options["adbc.flight.sql.session.option.dialect"])
        if self.drops and self.call.session != before:
            self.drops, self.call.session = self.drops - 1, before

    def get_option(self, key: str) -> str:
        result = FLIGHT["GetSessionOptionsResult"].FromString(self.sessions.get(self.call))
        return json.dumps({entry.key: entry.value.string_value for entry in result.session_options})


def test_session_options_are_set_again_until_the_cookie_comes_back():
    sessions = Sessions({"dialect": "snowflake"}, {"dialect": ("snowflake", "duckdb")})
    connection = _DroppingConnection(sessions, drops=2)
    set_session_options(connection, dialect="snowflake")  # the default: only `quail.session` tells it is set
    assert sessions.options(connection.call)["dialect"] == "snowflake" and sessions.known(connection.call)
    assert connection.drops == 0
    with pytest.raises(ConnectionError, match="in 5 tries"):
        set_session_options(_DroppingConnection(sessions, drops=SESSION_TRIES), dialect="duckdb")
