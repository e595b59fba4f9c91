"""A progress bar during the run: tqdm when installed, else one rewritten stderr line."""

from __future__ import annotations

import sys
import time


class Progress:
    """Counts finished requests of one level; `enabled=False` prints nothing."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._bar = None
        self._done = self._errors = self._total = 0
        self._label = ""
        self._last_draw = 0.0

    def start_level(self, label: str, total: int) -> None:
        self.close()
        self._done, self._errors, self._total, self._label = 0, 0, total, label
        if not self.enabled:
            return
        try:
            from tqdm import tqdm  # optional
        except ImportError:
            self._draw(force=True)
            return
        self._bar = tqdm(total=total, desc=label, unit="req", file=sys.stderr, leave=True)

    def note(self, message: str) -> None:
        """A one-off status line (e.g. while a level's workload is generated)."""
        if self.enabled:
            sys.stderr.write(message + "\n")
            sys.stderr.flush()

    def update(self, ok: bool) -> None:
        self._done += 1
        self._errors += 0 if ok else 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(errors=self._errors, refresh=False)
        else:
            self._draw()

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_draw < 0.5 and self._done < self._total:
            return
        self._last_draw = now
        sys.stderr.write(f"\r{self._label}: {self._done}/{self._total} requests, {self._errors} errors")
        sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.enabled and self._total:
            self._draw(force=True)
            sys.stderr.write("\n")
        self._total = 0
