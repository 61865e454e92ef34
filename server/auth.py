"""Authentication and roles: a password buys a signed, expiring token; a role says what a user may do.

A username and password (Basic, in Handshake) buy the bearer token.

Every other call must carry `authorization: Bearer <token>`. A token is
`<payload>.<signature>`: the payload names the user and the expiry time, the
signature is an HMAC-SHA256 under a secret drawn when the server starts (so
tokens end with the server run). Failed logins slow further tries of that user
from that client address (Throttle); no one is locked out.

One server is one tenant: every user reads every table. Roles, from the users
file (`user:password:role`): `read` (the default) queries and reads the
catalog; `write` also creates, fills, replaces and drops tables; `admin` also
sees every user's query text in `quail_queries` and reads `/metrics`. A server
without users has one trusted tenant: every caller may do everything.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import grpc

from quail.engine.errors import InvalidArgument, PermissionDenied, Unauthenticated


ROLES = ("read", "write", "admin")  # each may do what the roles before it may
FREE_FAILURES = 5  # failed logins in a row of one user from one client address before its tries are slowed
MAX_DELAY_S = 8.0  # the longest a slowed pair's tries are spaced
MAX_WAIT_S = 10.0  # the longest a try waits its turn (further tries are refused)
MAX_WAITING = 4  # tries waiting their turn at once, on the whole server
MAX_PAIRS = 100_000  # (user, address) pairs with failures remembered


@dataclass(frozen=True)
class User:
    """A user of the server: name, password hash, role."""

    password: str
    role: str = "read"


def load_users(path: str | Path) -> dict[str, User]:
    """`user:password[:role]` lines (blank lines and `#` comments skipped); a last `:part` that is no role
    belongs to the password."""
    users = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, rest = line.partition(":")
        password, _, role = rest.rpartition(":")
        if role not in ROLES or not password:
            password, role = rest, "read"
        if not sep or not user or not password:
            raise InvalidArgument(f"{path}:{number}: expected user:password or user:password:role")
        users[user] = User(password, role)
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


class Throttle:
    """Failed logins per (user, client address), slowed rather than locked out.

    - The first FREE_FAILURES failures of a pair in a row are answered at once.
    - After them each further try of that pair waits its turn: 1 s after the one before, then 2 s, 4 s, ...
      (at most MAX_DELAY_S), and is then tried, so a right password still logs in, only later.
    - A try whose turn is more than MAX_WAIT_S away, or that finds MAX_WAITING tries already waiting (on
      the whole server: a waiting try holds a call's thread), is refused at once.
    - Only that pair slows: another user from the same address (behind one proxy or NAT) or the same user
      from elsewhere is not touched. A success clears the pair; at most MAX_PAIRS pairs are remembered.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self._pairs: dict[tuple[str, str], tuple[int, float]] = {}  # failures in a row, when the next try may go
        self._waiting = 0
        self._lock = threading.Lock()
        self._clock = clock
        self._sleep = sleep

    def turn(self, user: str, client: str) -> None:
        """Wait for this pair's turn to try a password (Unauthenticated when it is too far or too many wait)."""
        key = (user, client)
        with self._lock:
            failures, free_at = self._pairs.get(key, (0, 0.0))
            if failures < FREE_FAILURES:
                return
            now = self._clock()
            wait = max(0.0, free_at - now)
            if wait > MAX_WAIT_S or (wait > 0 and self._waiting >= MAX_WAITING):
                raise Unauthenticated(f"too many failed logins for {user!r} from this address: try again in "
                                      f"{math.ceil(wait)} s")
            self._pairs[key] = (failures, now + wait + _delay(failures))  # a try beside this one goes after it
            self._waiting += wait > 0
        if wait > 0:
            try:
                self._sleep(wait)
            finally:
                with self._lock:
                    self._waiting -= 1

    def failed(self, user: str, client: str) -> None:
        key = (user, client)
        with self._lock:
            failures, free_at = self._pairs.pop(key, (0, 0.0))
            failures += 1
            if failures >= FREE_FAILURES:
                free_at = max(free_at, self._clock() + _delay(failures))
            if len(self._pairs) >= MAX_PAIRS:  # the pair that failed longest ago is forgotten
                del self._pairs[next(iter(self._pairs))]
            self._pairs[key] = (failures, free_at)

    def succeeded(self, user: str, client: str) -> None:
        with self._lock:
            self._pairs.pop((user, client), None)


def _delay(failures: int) -> float:
    """Seconds between tries of a pair with this many failures in a row (at least FREE_FAILURES)."""
    return min(MAX_DELAY_S, 2.0 ** (failures - FREE_FAILURES))


class Authenticator:
    """Checks passwords (throttled), issues tokens valid for `ttl_s` seconds, and verifies them."""

    def __init__(self, users: dict[str, User], ttl_s: float = 3600.0) -> None:
        self.users = users
        self.ttl_s = ttl_s
        self._secret = secrets.token_bytes(32)
        self.throttle = Throttle()

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

    def password(self, credentials: str, client: str) -> tuple[str, User]:
        """The name and user whose Basic credentials these are (tries throttled per user and client address)."""
        try:
            name, _, password = base64.b64decode(_padded(credentials)).decode().partition(":")
        except ValueError:
            raise Unauthenticated("malformed Basic credentials") from None
        self.throttle.turn(name, client)
        user = self.users.get(name)
        if user is None or not hmac.compare_digest(user.password.encode(), password.encode()):
            self.throttle.failed(name, client)
            raise Unauthenticated("wrong username or password")
        self.throttle.succeeded(name, client)
        return name, user

    def login(self, context: grpc.ServicerContext) -> str:
        """Handshake: Basic credentials → a token, sent back as `authorization: Bearer <token>`."""
        scheme, _, credentials = _header(context).partition(" ")
        if scheme.lower() != "basic":
            self.check(context)  # a client that already holds a token may handshake again
            return ""
        name, _ = self.password(credentials, _client(context))
        token = self.issue(name)
        context.send_initial_metadata((("authorization", f"Bearer {token}"),))
        return token

    def check(self, context: grpc.ServicerContext) -> str:
        """The caller's user, from its bearer token."""
        scheme, _, token = _header(context).partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("this server needs a login: connect with a username and password")
        return self.verify(token)

    def admin_http(self, authorization: str | None, client: str) -> bool:
        """Whether an HTTP request's `Authorization: Basic ...` names an admin (the metrics endpoint)."""
        scheme, _, credentials = (authorization or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            return self.password(credentials, client)[1].role == "admin"
        except Unauthenticated:
            return False


class Access:
    """What each caller may do, by its user's role (no users: every caller may do everything)."""

    def __init__(self, users: dict[str, User] | None = None) -> None:
        self.users = users

    def role(self, context: grpc.ServicerContext) -> str:
        if self.users is None:
            return "admin"
        user = self.users.get(user_of(context))
        return user.role if user is not None else "read"

    def allows(self, context: grpc.ServicerContext, role: str) -> bool:
        return ROLES.index(self.role(context)) >= ROLES.index(role)

    def require(self, context: grpc.ServicerContext, role: str, what: str) -> None:
        """PermissionDenied unless the caller's role is at least `role`."""
        if not self.allows(context, role):
            raise PermissionDenied(f"user {user_of(context)!r} may not {what}: its role is {self.role(context)!r}, "
                                   f"and that needs {role!r} (the users file's user:password:role)")


def _client(context: grpc.ServicerContext) -> str:
    """The caller's address without its port."""
    return context.peer().rsplit(":", 1)[0]
