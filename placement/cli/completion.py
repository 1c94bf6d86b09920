"""``placectl completion bash|zsh|fish``: the shell's completion script for ``placectl``.

Click completes commands, options and choices (``-o`` values among them) by running ``placectl``
itself with ``_PLACECTL_COMPLETE`` set; the script printed here is what the shell sources to ask
it. Install, e.g. ``eval "$(placectl completion bash)"`` in ``~/.bashrc``
(design/deployment.md, "Shell completion").
"""

from __future__ import annotations

import click

SHELLS = ("bash", "zsh", "fish")
#: The environment variable click's completion protocol uses for ``placectl``.
COMPLETE_VAR = "_PLACECTL_COMPLETE"


def completion_script(shell: str) -> str:
    """The completion script of ``shell`` for the ``placectl`` command."""
    from click.shell_completion import get_completion_class

    from placement.cli.main import cli

    complete = get_completion_class(shell)
    if complete is None:  # SHELLS are click's own; a click without one is a broken install
        raise click.UsageError(f"click cannot complete {shell}")
    return complete(cli, {}, "placectl", COMPLETE_VAR).source()


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS), metavar="SHELL")
def completion(shell: str) -> None:
    """Print SHELL's completion script: eval "$(placectl completion bash)" (zsh: the same;
    fish: placectl completion fish | source)."""
    click.echo(completion_script(shell))
