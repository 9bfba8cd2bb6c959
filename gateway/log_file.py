"""The gateway's ``--log-file``: one line per exchange, appended by a thread of its own through a
queue (the event loop never waits for the disk).

Writing it must never stop recording or a shutdown (docs/gateway.md, "Log file"): a line that
cannot be written (a full file system, an I/O error, a file removed under a read-only mount) is
dropped and counted (each line is one unbuffered write, so a line is either on disk or
counted), with one warning on stderr (``pvisor: warning: --log-file PATH: cannot
write: No space left on device; lines are dropped until it can``, at most every
:data:`WARN_EVERY_S` seconds); once a line can be written again, a line saying how many were
lost goes first. Closing never raises.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import queue
import sys
import time
from pathlib import Path

#: the least time between two warnings about the same log file
WARN_EVERY_S = 30.0


class _Appender(logging.Handler):
    """Appends each record as one line with one ``write`` on a file opened ``O_APPEND`` (0600 when
    it creates it): nothing is buffered, so a line the file system refuses is known to be lost,
    and counted, and one it takes is on disk."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.lost = 0
        self._warned_at: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.lost and self._write(f"{self.lost} log line(s) lost: the file could not be written"):
            self.lost = 0
        try:
            line = self.format(record)
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is not worth a traceback
            line = f"(a log record could not be formatted: {record.msg!r})"
        if not self._write(line, record):
            self.lost += 1

    def _write(self, text: str, record: logging.LogRecord | None = None) -> bool:
        if record is None:
            text = self.format(logging.LogRecord("pvisor", logging.WARNING, __file__, 0, text, None, None))
        data = (text + "\n").encode("utf-8", "replace")
        if self._fd is None:
            return False
        try:
            written = os.write(self._fd, data)
            if written < len(data):  # the file system took a part: end the line, count it lost
                os.write(self._fd, b"\n")
                return False
            return True
        except OSError as exc:
            self._warn(exc)
            return False

    def _warn(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self._warned_at is not None and now - self._warned_at < WARN_EVERY_S:
            return
        self._warned_at = now
        reason = getattr(exc, "strerror", None) or str(exc)
        try:
            sys.stderr.write(
                f"pvisor: warning: --log-file {self.path}: cannot write: {reason};"
                " lines are dropped until it can\n"
            )
            sys.stderr.flush()
        except (OSError, ValueError):
            pass  # no terminal either: nothing more to do

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        super().close()


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
