"""Errors the client side raises."""


class EngineDeadError(RuntimeError):
    """The engine core process died (or failed); in-flight and new requests fail with this."""
