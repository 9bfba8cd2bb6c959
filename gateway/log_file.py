"""The gateway's ``--log-file``: one line per exchange, appended by a thread of its own through a
queue (the event loop never waits for the disk).

Writing it must never stop recording or a shutdown (docs/gateway.md, "Log file"): a line that
cannot be written (a full file system, an I/O error, a file removed under a read-only mount) is
dropped and counted, with one warning on stderr (``pvisor: warning: --log-file PATH: cannot
write: No space left on device; lines are dropped until it can``, at most every
:data:`WARN_EVERY_S` seconds); once a line can be written again, a line saying how many were
lost goes first. Closing never raises.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import sys
import time
from pathlib import Path

#: the least time between two warnings about the same log file
WARN_EVERY_S = 30.0


class _Appender(logging.FileHandler):
    """A FileHandler that drops what it cannot write, counts it, and says so once in a while."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8")
        self.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        self.lost = 0
        self._warned_at: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.lost and self._write_line(f"{self.lost} log line(s) lost: the file could not be written"):
            self.lost = 0
        if not self._write_line(None, record):
            self.lost += 1

    def _write_line(self, text: str | None, record: logging.LogRecord | None = None) -> bool:
        try:
            line = self.format(record) if record is not None else self.format(self._note(text or ""))
            self.stream.write(line + self.terminator)
            self.stream.flush()
            return True
        except (OSError, ValueError) as exc:  # ValueError: the stream was closed under us
            self._warn(exc)
            return False

    @staticmethod
    def _note(text: str) -> logging.LogRecord:
        return logging.LogRecord("pvisor", logging.WARNING, __file__, 0, text, None, None)

    def _warn(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self._warned_at is not None and now - self._warned_at < WARN_EVERY_S:
            return
        self._warned_at = now
        reason = getattr(exc, "strerror", None) or str(exc)
        try:
            sys.stderr.write(
                f"pvisor: warning: --log-file {self.baseFilename}: cannot write: {reason};"
                " lines are dropped until it can\n"
            )
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # no terminal either: nothing more to do

    def close(self) -> None:
        try:
            super().close()
        except (OSError, ValueError) as exc:
            # what was buffered could not be flushed: the file is closed all the same
            self._warn(exc)
            try:
                if self.stream is not None:
                    self.stream.close()
            except (OSError, ValueError):
                pass
            self.stream = None  # type: ignore[assignment]


class LogFile:
    """``log`` appending to ``path`` from a thread of its own until :meth:`close`. Raises OSError
    when the file cannot be opened for appending (before anything is started)."""

    def __init__(self, log: logging.Logger, path: Path) -> None:
        self.path = path
        self._log = log
        self._appender = _Appender(path)
        q: queue.SimpleQueue = queue.SimpleQueue()
        self._listener: logging.handlers.QueueListener | None = logging.handlers.QueueListener(
            q, self._appender
        )
        self._listener.start()
        self._handler = logging.handlers.QueueHandler(q)
        log.addHandler(self._handler)

    @property
    def lost(self) -> int:
        """Lines dropped since the last one that could be written."""
        return self._appender.lost

    def close(self) -> None:
        """Write what is queued, then close the file. Idempotent; never raises."""
        listener, self._listener = self._listener, None
        if listener is None:
            return
        self._log.removeHandler(self._handler)
        try:
            listener.stop()
        finally:
            self._appender.close()
