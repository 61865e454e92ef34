"""Flight session options (SetSessionOptions, GetSessionOptions, CloseSession), keyed by a cookie.

A client's first SetSessionOptions opens a session and answers with the cookie
`arrow_flight_session_id`; a client that sends it back (ADBC: the option
`adbc.flight.sql.rpc.with_cookie_middleware`) has its options applied to every
later call. Calls without a known session see the server's defaults. The server adds the
read-only option `quail.last_query`: the report of the session's last query.
"""

from __future__ import annotations

import secrets
import threading
from typing import Callable, Mapping

import grpc
from google.protobuf.message import Message

from quail.server.flight_messages import FLIGHT, OPTION_INVALID_NAME, OPTION_INVALID_VALUE, SESSION_CLOSED

COOKIE = "arrow_flight_session_id"
LAST_QUERY = "quail.last_query"  # read-only: the report of the session's last query, as JSON


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
    """Options per session over the server's defaults; `allowed` lists each option's valid values."""

    def __init__(self, defaults: Mapping[str, str], allowed: Mapping[str, tuple[str, ...]]) -> None:
        self.defaults = dict(defaults)
        self.allowed = allowed
        self._sessions: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def options(self, context: grpc.ServicerContext) -> dict[str, str]:
        """The options in force for a call: the defaults, overlaid with its session's."""
        with self._lock:
            return {**self.defaults, **self._sessions.get(session_id(context) or "", {})}

    def set(self, context: grpc.ServicerContext, request: Message) -> bytes:
        """Apply a SetSessionOptionsRequest; each rejected option is named in the result's errors."""
        session = self._open(context)
        errors = []
        with self._lock:
            options = self._sessions[session]
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
        """The call's session, if it is one this server opened (and has not closed)."""
        session = session_id(context)
        with self._lock:
            return session if session in self._sessions else None

    def record(self, context: grpc.ServicerContext, key: str, value: Callable[[], str]) -> None:
        """Set a server-kept option of the caller's session to what `value` makes (made only for a caller
        with a session)."""
        with self._lock:
            session = self._sessions.get(session_id(context) or "")
            if session is not None:
                session[key] = value()

    def get(self, context: grpc.ServicerContext) -> bytes:
        return FLIGHT["GetSessionOptionsResult"](session_options=[
            FLIGHT["SessionOptionEntry"](key=k, value=FLIGHT["SessionOptionValue"](string_value=v))
            for k, v in sorted(self.options(context).items())]).SerializeToString()

    def close(self, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            self._sessions.pop(session_id(context) or "", None)
        return FLIGHT["CloseSessionResult"](status=SESSION_CLOSED).SerializeToString()

    def _open(self, context: grpc.ServicerContext) -> str:
        session = session_id(context)
        with self._lock:
            if session in self._sessions:
                return session
            session = secrets.token_urlsafe(16)
            self._sessions[session] = {}
        context.send_initial_metadata((("set-cookie", f"{COOKIE}={session}"),))
        return session
