"""What every ``placectl`` command shares: failing with one line, running a coroutine with the
error → exit-code table, the driver endpoints and API client, and the output conventions:
``-o/--output json|yaml|table|wide`` (``--json`` = ``-o json``) with :class:`Output`'s one
``emit``, and progress bars on stderr (:meth:`Output.progress`).

Exit codes: 2 for bad input (``INVALID_ARGUMENT``, ``NOT_FOUND``, ``ALREADY_EXISTS``,
``FAILED_PRECONDITION``, ``OUT_OF_RANGE``, a bad flag, a missing optional extra) and for a refused
credential (``PERMISSION_DENIED``, ``UNAUTHENTICATED``, a certificate or etcd password refused),
1 when no driver or etcd answers; never a traceback.

Kept light on purpose: ``placectl --help`` imports every command module, so asyncio, gRPC,
protobuf, rich and the clients are imported only where a command runs (design/architecture.md).
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

import click

from placement.errors import CredentialError, InvalidInput, PlacementError

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from placement.api.client import PlacementClient
    from placement.security.tls import TlsMaterial

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

#: Names of the gRPC status codes that mean "your input is wrong" (exit 2); others are exit 1.
BAD_INPUT = frozenset(
    {
        "INVALID_ARGUMENT",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "FAILED_PRECONDITION",
        "OUT_OF_RANGE",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
    }
)
#: Seconds a command keeps retrying unavailable drivers before it gives up (exit 1).
CLI_DEADLINE = 5.0
#: Third-party modules that only the ``pipeline`` extra installs.
PIPELINE_MODULES = frozenset({"pyspark", "pandas", "pyarrow", "matplotlib", "packaging"})

#: ``-o`` values: ``table`` the human output, ``wide`` with more columns, ``json``/``yaml`` data.
OUTPUT_FORMATS = ("table", "wide", "json", "yaml")


def stacked(*decorators: Callable[[Any], Any]) -> Callable[[F], F]:
    """``decorators`` as one, applied as if written one above the other in this order."""

    def apply(f: F) -> F:
        for decorate in reversed(decorators):
            f = decorate(f)
        return f

    return apply


def path_option(flag: str, dest: str, help: str, *, dir_okay: bool = True) -> Callable[[F], F]:
    """A required ``--flag PATH`` option, passed as a :class:`~pathlib.Path` named ``dest``."""
    return click.option(
        flag, dest, required=True, type=click.Path(path_type=Path, dir_okay=dir_okay), help=help
    )


def location_option(flag: str, dest: str, help: str) -> Callable[[F], F]:
    """A required ``--flag PATH|URI`` option: a local path (a :class:`~pathlib.Path`) or a
    Hadoop/Spark URI kept as text (:func:`placement.pipeline.locations.parse_location`)."""
    from placement.pipeline.locations import parse_location

    return click.option(
        flag,
        dest,
        required=True,
        metavar="PATH|URI",
        callback=lambda ctx, param, value: parse_location(value),
        help=help,
    )


def fail(message: str, code: int = 2) -> NoReturn:
    """Prints one clear line on stderr and exits ``code`` (2, bad input, unless told)."""
    click.echo(f"placectl: error: {message}", err=True)
    sys.exit(code)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; map errors to one line and the exit code (2 bad input, 1 unavailable)."""
    import asyncio

    from placement.api.client import ApiError

    try:
        return asyncio.run(coro)
    except ApiError as e:
        fail(e.detail or e.code.name.lower(), 2 if e.code.name in BAD_INPUT else 1)
    except (InvalidInput, CredentialError) as e:
        fail(str(e), 2)
    except PlacementError as e:
        fail(str(e), 1)


@contextmanager
def pipeline_extra(what: str) -> Iterator[None]:
    """Turns a missing ``pipeline`` extra module under ``what`` into one line and exit 2."""
    try:
        yield
    except ModuleNotFoundError as e:
        missing = (e.name or "").partition(".")[0]
        if missing not in PIPELINE_MODULES:
            raise
        fail(
            f"{what} needs the pipeline extra ({missing} is not installed): "
            "pip install 'placement[pipeline]'"
        )


def endpoints(ctx: click.Context) -> tuple[str, ...]:
    """The driver endpoints of the root ``--endpoint`` option, validated."""
    from placement.api.client import parse_endpoints

    obj = ctx.find_root().obj or {}
    return parse_endpoints(obj.get("endpoints", []))


def tls(ctx: click.Context) -> TlsMaterial | None:
    """The operator's TLS material of the root ``--cacert/--cert/--key`` (None: plaintext)."""
    found: TlsMaterial | None = (ctx.find_root().obj or {}).get("tls")
    return found


def api_client(ctx: click.Context) -> PlacementClient:
    """A client of the drivers named by ``--endpoint`` that gives up after ``CLI_DEADLINE``."""
    from placement.api.client import PlacementClient

    return PlacementClient(endpoints(ctx), deadline=CLI_DEADLINE, tls=tls(ctx))


def api_call(ctx: click.Context, method: str, message: Any) -> Any:
    """The reply of one API call ``method(message)``, failing over between the drivers; errors
    are one line and an exit code (:func:`run`)."""

    from placement.api.client import READS

    async def go() -> Any:
        async with api_client(ctx) as client:
            send = client.read if method in READS else client.call
            return await send(lambda stub, t: getattr(stub, method)(message, timeout=t))

    return run(go())


def pairs_text(pairs: Mapping[str, str]) -> str:
    """``K=V,K=V`` in key order, or ``-`` when there are none."""
    return ",".join(f"{k}={v}" for k, v in sorted(pairs.items())) or "-"


def echo_json(data: Any) -> None:
    """``data`` as one line of JSON, keys sorted."""
    click.echo(json.dumps(data, sort_keys=True))


def yaml_text(data: Any, *, document_start: bool = False) -> str:
    """``data`` as a YAML document (block style, keys sorted): the same data ``echo_json`` prints,
    ``yaml.safe_load`` gives it back. ``document_start``: begin with ``---`` (one document of a
    stream)."""
    import yaml

    return yaml.safe_dump(
        data,
        sort_keys=True,
        default_flow_style=False,
        allow_unicode=True,
        explicit_start=document_start,
        width=1_000_000,  # one value, one line
    )


#: What a human rendering of a command's answer is: a line (or lines) of text, or a rich
#: renderable (a table); ``wide`` asks for the extra columns.
Human = Callable[[bool], "str | RenderableType"]


class Bars(Protocol):
    """What a command calls on its progress bars (a ``rich.progress.Progress``, or nothing)."""

    def add_task(self, description: str, *, total: float | None = ..., **fields: Any) -> Any: ...

    def update(self, task_id: Any, **changes: Any) -> None: ...


class NoBars:
    """Progress bars that draw nothing: stderr is not a terminal, or the output is data."""

    def add_task(self, description: str, *, total: float | None = None, **fields: Any) -> int:
        return 0

    def update(self, task_id: Any, **changes: Any) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Output:
    """The ``-o`` a command was given; every command prints its answer through :meth:`emit`."""

    format: str = "table"

    @property
    def structured(self) -> bool:
        """JSON or YAML: data for a program, no progress bars, no decoration."""
        return self.format in ("json", "yaml")

    @property
    def wide(self) -> bool:
        return self.format == "wide"

    def emit(self, data: Any, human: Human, *, stream: bool = False) -> None:
        """Print one answer: ``data`` (JSON-able: dicts, lists, str, int, float, bool, None) as one
        JSON line or a YAML document, else ``human(wide)``. ``stream``: one of many (``--watch``):
        JSON stays one object per line, each YAML document begins with ``---``."""
        if self.format == "json":
            echo_json(data)
        elif self.format == "yaml":
            click.echo(yaml_text(data, document_start=stream), nl=False)
        else:
            shown = human(self.wide)
            if isinstance(shown, str):
                click.echo(shown)
            else:
                console().print(shown)

    @contextmanager
    def progress(self, console: Console | None = None) -> Iterator[Bars]:
        """Progress bars on stderr (or ``console``) while the block runs — only when that is a
        terminal and the output is not JSON/YAML, so piped and structured output stay clean.
        A task's ``detail`` field (pass ``detail=...``) is shown after the bar."""
        if self.structured:
            yield NoBars()
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        target = console or Console(stderr=True)
        if not target.is_terminal:
            yield NoBars()
            return
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[detail]}"),
            console=target,
            transient=False,
        ) as bars:
            yield _Detailed(bars)


class _Detailed:
    """A ``Progress`` whose tasks always have a ``detail`` field (the last column shows it)."""

    def __init__(self, bars: Any) -> None:
        self.bars = bars

    def add_task(self, description: str, *, total: float | None = None, **fields: Any) -> Any:
        fields.setdefault("detail", "")
        return self.bars.add_task(description, total=total, **fields)

    def update(self, task_id: Any, **changes: Any) -> None:
        self.bars.update(task_id, **changes)


def output_option(f: F) -> F:
    """``-o/--output json|yaml|table|wide`` and ``--json`` (the same as ``-o json``): the command
    gets one keyword argument, ``output``, an :class:`Output`. Put it after the command's other
    options; a conflicting pair (``--json -o yaml``) is a usage error (exit 2)."""

    @functools.wraps(f)
    def command(*args: Any, output: str | None, as_json: bool, **kwargs: Any) -> Any:
        if as_json and output not in (None, "json"):
            raise click.UsageError(f"--json is -o json; it cannot go with -o {output}")
        chosen = "json" if as_json else (output or "table")
        return f(*args, output=Output(chosen), **kwargs)

    return stacked(  # type: ignore[return-value]
        click.option(
            "-o",
            "--output",
            "output",
            type=click.Choice(OUTPUT_FORMATS, case_sensitive=False),
            default=None,
            help="Output format: table (default), wide (table with more columns), json, yaml.",
        ),
        click.option("--json", "as_json", is_flag=True, help="The same as -o json."),
    )(command)


def console() -> Console:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


class LazyGroup(click.Group):
    """A group whose commands are named by ``module:attribute`` and imported on first use."""

    def __init__(self, *args: Any, lazy: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        module, _, attr = target.partition(":")
        command = getattr(importlib.import_module(module), attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command
