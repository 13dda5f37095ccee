"""libtier's status codes and the exceptions that carry them.

Every error the library reports reaches Python as an instance of a subclass of :class:`Error`
chosen by its code (``NotFound`` for ``Code.NOT_FOUND``, ...). ``.code`` is the
:class:`Code`, ``.code_name`` its stable lower-case name ("not_found", the same string as the C
API's ``tier_code_name`` and the C++ ``tier::code_name``) and ``.message`` the library's message.
The numbers are those of ``tier::Code`` and of the C API's ``TIER_*`` status codes.
"""

from __future__ import annotations

import enum


class Code(enum.IntEnum):
    """Status codes (the numbers of ``tier::Code`` and the C API's ``tier_status``)."""

    OK = 0
    NOT_FOUND = 1
    REJECTED = 2
    RETRY = 3
    INVALID_ARGUMENT = 4
    NOT_SUPPORTED = 5
    IO_ERROR = 6
    DEVICE_ERROR = 7
    CHECKSUM_MISMATCH = 8
    CANCELLED = 9
    TIMED_OUT = 10
    BAD_STATE = 11
    ALREADY_EXISTS = 12
    NO_SPACE = 13

    @property
    def code_name(self) -> str:
        """The stable lower-case name: "ok", "not_found", ..."""
        return self.name.lower()


class Error(Exception):
    """An error reported by libtier: ``.code`` (a :class:`Code`), ``.code_name``, ``.message``."""

    code: Code = Code.BAD_STATE

    def __init__(self, code: int, message: str = "") -> None:
        self.code = Code(code)
        self.message = message
        super().__init__(f"{self.code.code_name}: {message}" if message else self.code.code_name)

    @property
    def code_name(self) -> str:
        return self.code.code_name


class NotFound(Error):
    """The key is not stored (a miss)."""


class Rejected(Error):
    """Refused by policy: fenced key, full queue, admission."""


class Retry(Error):
    """Transient: the same call may succeed later."""


class InvalidArgument(Error, ValueError):
    """The caller's input is wrong (bad region, buffer too small, bad profile)."""


class NotSupported(Error):
    """A tier, codec or this build lacks the capability."""


class IoError(Error, OSError):
    """The medium failed (errno, socket, protocol)."""


class DeviceError(Error):
    """The GPU runtime failed."""


class ChecksumMismatch(Error):
    """Stored bytes failed verification; they are never handed out."""


class Cancelled(Error):
    pass


class TimedOut(Error, TimeoutError):
    pass


class BadState(Error):
    """The object is used in a state that does not allow the call (e.g. a closed Store)."""


class AlreadyExists(Error):
    """Put-if-absent found the key (not an error for a cache)."""


class NoSpace(Error):
    """Capacity or the medium is full."""


_BY_CODE: dict[int, type[Error]] = {
    Code.NOT_FOUND: NotFound,
    Code.REJECTED: Rejected,
    Code.RETRY: Retry,
    Code.INVALID_ARGUMENT: InvalidArgument,
    Code.NOT_SUPPORTED: NotSupported,
    Code.IO_ERROR: IoError,
    Code.DEVICE_ERROR: DeviceError,
    Code.CHECKSUM_MISMATCH: ChecksumMismatch,
    Code.CANCELLED: Cancelled,
    Code.TIMED_OUT: TimedOut,
    Code.BAD_STATE: BadState,
    Code.ALREADY_EXISTS: AlreadyExists,
    Code.NO_SPACE: NoSpace,
}


def error_for(code: int, message: str) -> Error:
    """The exception instance for a non-OK code (called by the extension)."""
    cls = _BY_CODE.get(int(code), Error)
    return cls(code, message)
