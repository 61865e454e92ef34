"""Authentication: a username and password (Basic, in Handshake) buy a signed, expiring bearer token.

Every other call must carry `authorization: Bearer <token>`. A token is
`<payload>.<signature>`: the payload names the user and the expiry time, the
signature is an HMAC-SHA256 under a secret drawn when the server starts (so
tokens end with the server run).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from pathlib import Path

import grpc

from quail.engine.errors import InvalidArgument, Unauthenticated


def load_users(path: str | Path) -> dict[str, str]:
    """`user:password` lines (blank lines and `#` comments skipped)."""
    users = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user or not password:
            raise InvalidArgument(f"{path}:{number}: expected user:password")
        users[user] = password
    return users


def _header(context: grpc.ServicerContext) -> str:
    return next((value for key, value in context.invocation_metadata() if key == "authorization"), "")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _padded(text: str) -> str:
    """Base64 text with its padding restored (tokens drop it, some clients send Basic credentials without)."""
    return text + "=" * (-len(text) % 4)


def _claims(body: str) -> tuple[bytes, dict]:
    """A token's payload and the claims it holds (not yet verified)."""
    try:
        payload = base64.urlsafe_b64decode(_padded(body))
        claims = json.loads(payload)
    except ValueError:
        claims = None
    if not isinstance(claims, dict):
        raise Unauthenticated("malformed bearer token")
    return payload, claims


def user_of(context: grpc.ServicerContext) -> str:
    """The user named by a call's bearer token (verified before the call ran where the server has users),
    or "-": no token, or one that is not Quail's (a server without users takes any, `Bearer None` too)."""
    scheme, _, token = _header(context).partition(" ")
    if scheme.lower() != "bearer" or not token:
        return "-"
    try:
        claims = _claims(token.partition(".")[0])[1]
    except Unauthenticated:
        return "-"
    return str(claims.get("user", "-"))


class Authenticator:
    """Checks passwords, issues tokens valid for `ttl_s` seconds, and verifies them."""

    def __init__(self, users: dict[str, str], ttl_s: float = 3600.0) -> None:
        self.users = users
        self.ttl_s = ttl_s
        self._secret = secrets.token_bytes(32)

    def _sign(self, payload: bytes) -> str:
        return _b64(hmac.new(self._secret, payload, hashlib.sha256).digest())

    def issue(self, user: str) -> str:
        payload = json.dumps({"user": user, "exp": time.time() + self.ttl_s}).encode()
        return f"{_b64(payload)}.{self._sign(payload)}"

    def verify(self, token: str) -> str:
        """The token's user; Unauthenticated when it is malformed, forged or expired."""
        body, _, signature = token.partition(".")
        payload, claims = _claims(body)
        if not hmac.compare_digest(self._sign(payload), signature):
            raise Unauthenticated("invalid bearer token")
        if not isinstance(claims.get("exp"), (int, float)) or claims["exp"] < time.time():
            raise Unauthenticated("bearer token expired: log in again")
        return claims["user"]

    def login(self, context: grpc.ServicerContext) -> str:
        """Handshake: Basic credentials → a token, sent back as `authorization: Bearer <token>`."""
        scheme, _, credentials = _header(context).partition(" ")
        if scheme.lower() != "basic":
            self.check(context)  # a client that already holds a token may handshake again
            return ""
        try:
            user, _, password = base64.b64decode(_padded(credentials)).decode().partition(":")
        except ValueError:
            raise Unauthenticated("malformed Basic credentials") from None
        expected = self.users.get(user)
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
            raise Unauthenticated("wrong username or password")
        token = self.issue(user)
        context.send_initial_metadata((("authorization", f"Bearer {token}"),))
        return token

    def check(self, context: grpc.ServicerContext) -> str:
        """The caller's user, from its bearer token."""
        scheme, _, token = _header(context).partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("this server needs a login: connect with a username and password")
        return self.verify(token)
