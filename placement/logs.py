"""How every process logs: ``--log-format text|json`` and ``--log-level`` (design/observability.md).

JSON lines come from python-json-logger: one object per line with ``ts``, ``level``,
``logger``, ``message``, the process's own fields (``component``: driver or agent, ``node`` or
``driver``), and the context of the work that logged it — ``zone``, ``partition``, ``revision``
and ``epoch`` where they apply. The context is a :mod:`contextvars` value set by the code that
starts a piece of work (:func:`log_context`: a driver term, a mover, a primary, an agent's
Rebalance), so every line logged inside it — and inside the tasks it creates, which copy the
context — carries it without each call passing it. Text lines look as they always did, with the
context appended in brackets.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from placement.errors import InvalidInput

FORMATS = ("text", "json")
#: The context fields, in the order text lines show them.
FIELDS = ("zone", "partition", "node", "revision", "epoch")

_NONE: Mapping[str, object] = MappingProxyType({})
_context: contextvars.ContextVar[Mapping[str, object]] = contextvars.ContextVar(
    "placement_log_context", default=_NONE
)


@contextlib.contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Lines logged inside (and in tasks created inside) carry ``fields`` (None values are
    left out), on top of the context already set."""
    merged = {**_context.get(), **{k: v for k, v in fields.items() if v is not None}}
    token = _context.set(merged)
    try:
        yield
    finally:
        _context.reset(token)


def set_log_context(**fields: object) -> None:
    """Like :func:`log_context` for the rest of the current task (a task's own context copy)."""
    _context.set({**_context.get(), **{k: v for k, v in fields.items() if v is not None}})


class _ContextFilter(logging.Filter):
    """Puts the current context's fields on every record (``record.zone`` ...)."""

    def __init__(self, static: Mapping[str, object]) -> None:
        super().__init__()
        self._static = dict(static)

    def filter(self, record: logging.LogRecord) -> bool:
        fields = {**self._static, **_context.get()}
        for key, value in fields.items():
            if not hasattr(record, key):
                setattr(record, key, value)
        record.context_text = " ".join(
            f"{k}={fields[k]}" for k in FIELDS if k in fields and k not in self._static
        )
        return True


#: gRPC's asyncio server logs this, with a traceback, when it cannot send a unary answer
#: because the call already ended — the client gave up (deadline, cancel, disconnect) while the
#: handler ran — and it has not noticed the cancellation yet (when it has, it says nothing).
_UNSENT = "ExecuteBatchError raised in core by servicer method"


class _AnswerNotSent(logging.Filter):
    """Turns gRPC's traceback for an answer its client no longer waited for into one INFO
    line: nothing failed on this side, and a traceback in an operator's log says otherwise."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(_UNSENT):
            method = message.removeprefix(_UNSENT).strip(" []")
            record.msg = "the answer to %s was not sent: the client's call had ended (it gave up)"
            record.args = (method,)
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info = record.exc_text = None
        return True


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = getattr(record, "context_text", "")
        return f"{line} [{context}]" if context else line


def configure_logging(
    level: str = "INFO", fmt: str = "text", static: Mapping[str, object] | None = None
) -> None:
    """Route every logger to stderr in ``fmt`` at ``level``; ``static`` fields go on every JSON
    line (``component``, ``node``...). InvalidInput naming ``--log-format``/``--log-level``."""
    if fmt not in FORMATS:
        raise InvalidInput("--log-format", f"{fmt!r} is not a log format", "use text or json")
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise InvalidInput(
            "--log-level", f"{level!r} is not a level", "use DEBUG, INFO, WARNING or ERROR"
        )
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ContextFilter(static or {}))
    formatter: logging.Formatter
    if fmt == "json":
        formatter = JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "ts", "levelname": "level", "name": "logger"},
            reserved_attrs=[*_RESERVED, "context_text"],
        )
    else:
        formatter = _TextFormatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    grpc_core = logging.getLogger("grpc._cython.cygrpc")
    if not any(isinstance(f, _AnswerNotSent) for f in grpc_core.filters):
        grpc_core.addFilter(_AnswerNotSent())


#: LogRecord attributes that are not fields of a JSON line (the library's own default list).
_RESERVED: tuple[str, ...] = tuple(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys() | {"message", "asctime"}
)


def context() -> dict[str, Any]:
    """The current log context (for tests and for code that passes it on)."""
    return dict(_context.get())
