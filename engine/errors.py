"""The error hierarchy every room raises; the server maps each class to one Flight status."""


class QuailError(Exception):
    """Base of every error a user may see; the message is shown to the client as is."""


class InvalidArgument(QuailError):
    """The request is malformed: bad SQL, wrong arguments, a placeholder mismatch."""


class NotFound(QuailError):
    """A named object (table, prepared statement, query) does not exist."""


class AlreadyExists(QuailError):
    """A named object exists where the request asked to create it."""


class Aborted(QuailError):
    """The statement's transaction lost a conflict with another (both changed the same rows): try it again."""


class ResourceExhausted(QuailError):
    """A limit was reached: queue full, too many requests, memory."""


class Cancelled(QuailError):
    """The query was cancelled by the client."""


class DeadlineExceeded(QuailError):
    """The query ran past its time limit."""


class Unavailable(QuailError):
    """The server cannot take the request now (shutting down, model missing)."""


class Unauthenticated(QuailError):
    """The call carries no valid credentials (missing, wrong, or an expired token)."""


class PermissionDenied(QuailError):
    """The caller is known but may not do this (its role does not allow it)."""


class Unimplemented(QuailError):
    """The server does not implement the requested call or command."""
