"""Flight session options (SetSessionOptions, GetSessionOptions, CloseSession), keyed by a cookie.

A client's first SetSessionOptions opens a session and answers with the cookie
`arrow_flight_session_id`; a client that sends it back (ADBC: the option
`adbc.flight.sql.rpc.with_cookie_middleware`) has its options applied to every
later call. Calls without a known session see the server's defaults. The server adds two
read-only options: `quail.session` ("open", only within a session: a client that set options can read
back that its cookie came with the call) and `quail.last_query` (the report of the session's last query).
A session unused for SESSION_IDLE_S ends, and at most MAX_SESSIONS are kept (opening one more ends the
least recently used): a client that opens sessions without end holds no more memory.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from typing import Callable, Mapping

import grpc
from google.protobuf.message import Message

from quail.server.flight_messages import FLIGHT, OPTION_INVALID_NAME, OPTION_INVALID_VALUE, SESSION_CLOSED

COOKIE = "arrow_flight_session_id"
LAST_QUERY = "quail.last_query"  # read-only: the report of the session's last query, as JSON
OPEN = "quail.session"  # read-only: "open" within a session, absent outside one
SESSION_IDLE_S = 3600.0  # a session unused this long ends
MAX_SESSIONS = 10_000


def session_id(context: grpc.ServicerContext) -> str | None:
    """The Flight session a call belongs to (its cookie), or None."""
    for key, value in context.invocation_metadata():
        if key == "cookie":
            for part in value.split(";"):
                name, _, content = part.strip().partition("=")
                if name == COOKIE:
                    return content
    return None


def _text(value: Message) -> str | None:
    """A session option value as text (None: unset, which erases the option)."""
    for field in ("string_value", "bool_value", "int64_value", "double_value"):
        if value.HasField(field):
            return str(getattr(value, field)).lower() if field == "bool_value" else str(getattr(value, field))
    if value.HasField("string_list_value"):
        return ",".join(value.string_list_value.values)
    return None


class Sessions:
    """Options per session over the server's defaults.

    `allowed` lists each option's valid values. Sessions
    are kept least recently used first: those idle for `idle_s`, and any past `max_count`, end."""

    def __init__(self, defaults: Mapping[str, str], allowed: Mapping[str, tuple[str, ...]],
                 idle_s: float = SESSION_IDLE_S, max_count: int = MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.defaults = dict(defaults)
        self.allowed = allowed
        self.idle_s, self.max_count = idle_s, max_count
        self._clock = clock
        self._sessions: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._used: dict[str, float] = {}
        self._lock = threading.Lock()

    def _find(self, context: grpc.ServicerContext) -> dict[str, str] | None:
        """The call's session's options, now its most recent use (None: none, or ended); under the lock."""
        self._end_idle()
        session = session_id(context) or ""
        options = self._sessions.get(session)
        if options is not None:
            self._sessions.move_to_end(session)
            self._used[session] = self._clock()
        return options

    def _end_idle(self) -> None:
        """End the sessions idle for idle_s, least recently used first (under the lock)."""
        now = self._clock()
        while self._sessions and now - self._used[next(iter(self._sessions))] > self.idle_s:
            self._used.pop(self._sessions.popitem(last=False)[0])

    def options(self, context: grpc.ServicerContext) -> dict[str, str]:
        """The options in force for a call: the defaults, overlaid with its session's."""
        with self._lock:
            return {**self.defaults, **(self._find(context) or {})}

    def set(self, context: grpc.ServicerContext, request: Message) -> bytes:
        """Apply a SetSessionOptionsRequest; each rejected option is named in the result's errors."""
        errors = []
        with self._lock:
            options = self._open(context)
            for entry in request.session_options:
                value = _text(entry.value)
                if entry.key not in self.allowed:
                    errors.append((entry.key, OPTION_INVALID_NAME))
                elif value is None:
                    options.pop(entry.key, None)
                elif value not in self.allowed[entry.key]:
                    errors.append((entry.key, OPTION_INVALID_VALUE))
                else:
                    options[entry.key] = value
        return FLIGHT["SetSessionOptionsResult"](errors=[
            FLIGHT["SessionOptionErrorEntry"](key=k, value=FLIGHT["SessionOptionError"](value=code))
            for k, code in errors]).SerializeToString()

    def known(self, context: grpc.ServicerContext) -> str | None:
        """The call's session, if it is one this server opened (and has not ended)."""
        with self._lock:
            return session_id(context) if self._find(context) is not None else None

    def record(self, context: grpc.ServicerContext, key: str, value: Callable[[], str]) -> None:
        """Set a server-kept option of the caller's session to what `value` makes (made only for a caller
        with a session)."""
        with self._lock:
            session = self._find(context)
            if session is not None:
                session[key] = value()

    def get(self, context: grpc.ServicerContext) -> bytes:
        """The options in force for the call, and OPEN where it has a session."""
        with self._lock:
            session = self._find(context)
            options = {**self.defaults, **session, OPEN: "open"} if session is not None else self.defaults
        return FLIGHT["GetSessionOptionsResult"](session_options=[
            FLIGHT["SessionOptionEntry"](key=k, value=FLIGHT["SessionOptionValue"](string_value=v))
            for k, v in sorted(options.items())]).SerializeToString()

    def close(self, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            session = session_id(context) or ""
            self._sessions.pop(session, None)
            self._used.pop(session, None)
        return FLIGHT["CloseSessionResult"](status=SESSION_CLOSED).SerializeToString()

    def _open(self, context: grpc.ServicerContext) -> dict[str, str]:
        """The call's session's options, a new session's where it has none (its cookie sent back); the least
        recently used session ends when there would be more than max_count (under the lock)."""
        options = self._find(context)
        if options is not None:
            return options
        session = secrets.token_urlsafe(16)
        while len(self._sessions) >= self.max_count:
            self._used.pop(self._sessions.popitem(last=False)[0])
        options = self._sessions[session] = {}
        self._used[session] = self._clock()
        context.send_initial_metadata((("set-cookie", f"{COOKIE}={session}"),))
        return options
