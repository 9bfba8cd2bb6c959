"""Errors with the exit code the CLI maps them to (documented in ``docs/cli.md``).

Every layer raises these for user-facing failures; the CLI prints ``pvisor: error: <message>``
and exits with ``exit_code``, never a traceback. Messages name the file, line, run or exchange
concerned and what was expected, and never contain a secret.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTEGRITY = 3
EXIT_DATA = 65  # bad input data (sysexits EX_DATAERR)
EXIT_UNAVAILABLE = 69  # a service we need is unavailable (EX_UNAVAILABLE)
EXIT_IOERR = 74  # output could not be written: disk full, I/O error (EX_IOERR)
EXIT_TIMEOUT = 124  # same as timeout(1)
EXIT_BROKEN_PIPE = 141  # the reader of stdout went away (128 + SIGPIPE, what a shell shows)


class PvisorError(Exception):
    """Base class of the errors a user can cause or meet; ``exit_code`` is the process exit code."""

    exit_code: int = 1

    def __init__(self, message: str, *, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.__class__.__name__

    def lines(self) -> list[str]:
        """The lines the CLI prints, each as ``pvisor: error: LINE``: the message; an error that
        gathers several problems (``pvisor.replay.spec.ReplayProblems``) gives one per problem."""
        return [self.message]


class UsageError(PvisorError):
    """Wrong arguments: unknown run or exchange id, option combination that makes no sense (exit 2)."""

    exit_code = EXIT_USAGE


class IntegrityError(PvisorError):
    """The journal is damaged: a blob is missing, a digest does not match, SQLite reports corruption
    (exit 3)."""

    exit_code = EXIT_INTEGRITY


class BadInputError(PvisorError):
    """Input data is malformed: a body that does not parse, a file that is not a journal (exit 65)."""

    exit_code = EXIT_DATA


class UnavailableError(PvisorError):
    """A service pvisor needs is unavailable: upstream down, journal locked past the busy timeout
    (exit 69)."""

    exit_code = EXIT_UNAVAILABLE


class OutputError(PvisorError):
    """Output cannot be written: stdout or an output file on a full disk, an I/O error (exit 74)."""

    exit_code = EXIT_IOERR


class TimeoutExpired(PvisorError):
    """A run or wait hit its time limit (exit 124)."""

    exit_code = EXIT_TIMEOUT


#: how many characters of a value a message shows whole (:func:`shown`)
SHOWN_CHARS = 80


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """``value`` as a message quotes it: whole when it has at most ``limit`` characters, else its
    start and end around ``...`` with its length (``aaaa...aaaa (200000 characters)``), so that
    a huge id given by mistake is not echoed in full."""
    if len(value) <= limit:
        return value
    return f"{value[: limit // 2]}...{value[-(limit // 4) :]} ({len(value)} characters)"
