"""``placectl certs``: a private CA and the certificates of a deployment (design/deployment.md).

``certs init --dir DIR`` creates the CA (``ca.crt``, ``ca.key``); ``certs issue --dir DIR --name
NAME --role ROLE [--host H ...]`` issues ``NAME.crt``/``NAME.key`` signed by it — a process's
(role ``driver`` or ``agent``; an agent's name is its node's), an operator's (``admin``,
``reader``, ``client``) or etcd's (``none``: no role, so the product's servers refuse it; its
name is the etcd user). ``--host`` names what peers dial (repeatable; default ``localhost`` and
``127.0.0.1``). Existing files are kept unless ``--force`` (a rotation: issue again, restart the
process). Keys are written ``0600``.
"""

from __future__ import annotations

from pathlib import Path

import click

from placement.cli.common import fail

ROLES = ("driver", "agent", "admin", "reader", "client", "none")
_DIR = click.option(
    "--dir",
    "directory",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Directory of the CA and certificates.",
)


@click.group("certs")
def certs() -> None:
    """Create a private CA and issue certificates for drivers, agents, operators and etcd."""


@certs.command("init")
@_DIR
@click.option("--days", type=click.IntRange(1, 36500), default=3650, show_default=True)
@click.option("--force", is_flag=True, help="Replace an existing CA (every certificate with it).")
def init(directory: Path, days: int, force: bool) -> None:
    """Create the CA: DIR/ca.crt (give it to every process) and DIR/ca.key (keep it private)."""
    import datetime as dt

    from placement.security.pki import issue_ca, write_pair

    if (directory / "ca.crt").exists() and not force:
        fail(f"--dir: {directory / 'ca.crt'} exists (pass --force to replace the CA)")
    write_pair(directory, "ca", issue_ca("placement CA", dt.datetime.now(dt.UTC), days))
    click.echo(f"created {directory / 'ca.crt'} and {directory / 'ca.key'}")


@certs.command("issue")
@_DIR
@click.option(
    "--name", required=True, help="Common name: the node, driver id, operator or etcd user."
)
@click.option("--role", required=True, type=click.Choice(ROLES), help="What it may call.")
@click.option("--host", "hosts", multiple=True, help="Host name or IP peers dial (repeatable).")
@click.option("--days", type=click.IntRange(1, 3650), default=365, show_default=True)
@click.option("--force", is_flag=True, help="Replace an existing certificate (rotation).")
def issue(
    directory: Path, name: str, role: str, hosts: tuple[str, ...], days: int, force: bool
) -> None:
    """Issue DIR/NAME.crt and DIR/NAME.key, signed by the CA in DIR."""
    import datetime as dt

    from placement.security.pki import Pair, Role, write_pair
    from placement.security.pki import issue as issue_pair

    ca_cert, ca_key = directory / "ca.crt", directory / "ca.key"
    if not (ca_cert.exists() and ca_key.exists()):
        fail(f"--dir: no CA in {directory} (run placectl certs init --dir {directory})")
    if (directory / f"{name}.crt").exists() and not force:
        fail(f"--name: {directory / f'{name}.crt'} exists (pass --force to issue it again)")
    ca = Pair(ca_cert.read_bytes(), ca_key.read_bytes())
    now = dt.datetime.now(dt.UTC)
    pair = issue_pair(
        ca,
        name,
        None if role == "none" else Role(role),
        now,
        hosts=hosts or ("localhost", "127.0.0.1"),
        days=days,
    )
    cert, key = write_pair(directory, name, pair)
    until = (now + dt.timedelta(days=days)).date().isoformat()
    click.echo(f"issued {cert} and {key} (role {role}, valid until {until})")
