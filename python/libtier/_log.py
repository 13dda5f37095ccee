"""libtier's log in Python's ``logging``, under the logger ``"libtier"`` (docs/logging.md).

The library calls its sink on whichever thread logs, library threads included. The extension's
sink never takes the GIL there: it queues the message (at most 4096; more are counted as dropped)
and a daemon thread of this module, ``libtier-log``, takes them with the GIL released and hands
each to ``logging.getLogger("libtier")`` with its level. So a handler may call libtier, and a
library thread never waits for the GIL. Delivery is asynchronous: :func:`flush_logs` waits for
what was logged before it. After ``os.fork()`` the child starts a thread of its own; at exit the
sink goes back to stderr.

The library's own threshold (``set_log_level``, ``TIER_LOG_LEVEL``, a profile's ``"log"``) decides
what reaches Python; the logger's level and handlers decide what Python shows. Warnings by
default: with no handler configured, Python prints them to stderr.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading

from . import _libtier

logger = logging.getLogger("libtier")

_TO_PYTHON = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG}
_LEVELS = {"off": 0, "error": 1, "warn": 2, "info": 3, "debug": 4}

_cond = threading.Condition()
_delivered = 0  # messages handed to logging (guarded by _cond)
_thread: threading.Thread | None = None


def _forward() -> None:
    global _delivered
    while True:
        messages, dropped, closed = _libtier._take_logs(0.5)
        for level, text in messages:
            logger.log(_TO_PYTHON.get(level, logging.DEBUG), "%s", text)
        if dropped:
            logger.warning("%d libtier log messages dropped: the queue was full", dropped)
        with _cond:
            _delivered += len(messages)
            _cond.notify_all()
        if closed and not messages:
            return


def _start() -> None:
    global _thread, _delivered
    with _cond:
        _delivered = _libtier._log_counts()[1]
    _libtier._log_route()
    _thread = threading.Thread(target=_forward, name="libtier-log", daemon=True)
    _thread.start()


def _after_fork_in_child() -> None:
    _libtier._log_after_fork()  # a fresh queue: the parent's lock may be held by a thread gone
    _start()


def _stop() -> None:
    _libtier._log_close()  # the sink back to stderr; the thread delivers what is queued, then ends
    if _thread is not None:
        _thread.join(timeout=1.0)


def set_log_level(level: str) -> None:
    """Sets libtier's log level for the process: "error", "warn", "info", "debug" or "off".

    It always applies, and profiles no longer change it (docs/logging.md)."""
    if not isinstance(level, str) or level not in _LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(_LEVELS)}")
    _libtier._set_log_level(_LEVELS[level])


def log_level() -> str:
    """libtier's log level now: "error", "warn", "info", "debug" or "off"."""
    value = _libtier._log_level()
    return next(name for name, v in _LEVELS.items() if v == value)


def flush_logs(timeout: float = 5.0) -> bool:
    """Waits until every message libtier logged before this call was handed to ``logging``.
    Returns False when `timeout` seconds passed first."""
    target = _libtier._log_counts()[0]
    with _cond:
        return _cond.wait_for(lambda: _delivered >= target, timeout)


_start()
os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_stop)
