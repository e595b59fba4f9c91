"""Errors the client side raises."""


class EngineDeadError(RuntimeError):
    """The engine core process died (or failed); in-flight and new requests fail with this."""


class RequestFailedError(RuntimeError):
    """This request failed inside the engine (finish reason "error"); the engine and other requests
    carry on. The message says what kind of failure it was; the details are in the engine's log."""
