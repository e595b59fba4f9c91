"""SIGINT and SIGTERM during `lightspeed serve`'s start-up.

Three phases, each with the handling that is safe in it:
1. Importing (torch, the engine, uvicorn): nothing has started that needs stopping, and a
   KeyboardInterrupt raised while an extension module initialises can abort the process
   (pybind11 turns a Python exception inside its C++ callbacks into std::terminate, exit -6).
   So a signal exits at once, status 130.
2. Loading the model: the engine core process exists. A signal raises KeyboardInterrupt in the
   gateway, whose `finally` shuts the core down, so no core is orphaned.
3. Serving: uvicorn owns both signals (graceful stop) and re-raises them when done; the phase-2
   handlers are still installed then, so the re-raise ends in the same KeyboardInterrupt path.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
INTERRUPTED = 130  # the shell's status for a process ended by Ctrl-C


def _exit_now(signum, frame) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(INTERRUPTED)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _handling(handler):
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def exit_at_once():
    """Phase 1, for the whole command: a signal ends the process now (nothing to stop yet)."""
    return _handling(_exit_now)


def interrupt_on_signal():
    """Phases 2 and 3: a signal raises KeyboardInterrupt, so `finally` blocks stop the engine core."""
    return _handling(_raise_interrupt)
