"""The bad requests the core refuses: `RequestError` and its five kinds. Every one leaves
state unchanged.

The service maps them in one place: InvalidArgument → gRPC INVALID_ARGUMENT / HTTP 400,
FailedPrecondition → gRPC FAILED_PRECONDITION / HTTP 409, NotFound → NOT_FOUND / 404
(an agent that gets NOT_FOUND for its host registers again), PermissionDenied →
PERMISSION_DENIED / 403 (a caller acting for a host or replica it is not), RetryLater →
ABORTED / 503 (the request may succeed later as it is: the caller waits and sends it again).
"""


class RequestError(Exception):
    """A request the controller refuses; the message names the bad value."""


class InvalidArgument(RequestError):
    """The request itself is malformed (negative numbers, empty or oversized fields)."""


class FailedPrecondition(RequestError):
    """The request is well formed but conflicts with the controller's state."""


class NotFound(RequestError):
    """The request names something the controller does not know."""


class PermissionDenied(RequestError):
    """The caller may not act for the host or replica it names (wrong secret or certificate)."""


class RetryLater(RequestError):
    """The request conflicts with state that will change by itself (a live agent holds the
    host until its heartbeats time out): send it again later, as it is."""
