"""``pvisor ca``: the certificate authority of intercept mode (docs/intercept.md)."""

from __future__ import annotations

from pathlib import Path

import click

from pvisor.commands.base import Group, PathParam
from pvisor.gateway.intercept import CA_BUNDLE, ensure_ca
from pvisor.journal.paths import absolute


@click.group("ca", cls=Group)
def ca() -> None:
    """The CA intercept mode's proxy signs the model hosts' certificates with. Its key never
    leaves its directory (0600 in a 0700 directory); agents trust the certificate."""


@ca.command("path")
@click.option(
    "--confdir",
    type=PathParam(file_okay=False),
    default=None,
    help="The CA's directory (default $PVISOR_CA_DIR, else ~/.local/share/pvisor/ca).",
)
@click.option(
    "--bundle",
    is_flag=True,
    help="Print the bundle instead: the system's CAs plus this one (for SSL_CERT_FILE, REQUESTS_CA_BUNDLE).",
)
@click.option("--mitmdump", default=None, metavar="PATH", help="The mitmdump that creates it on first use.")
def ca_path(confdir: str | None, bundle: bool, mitmdump: str | None) -> None:
    """Print the path of the CA certificate (PEM), creating the CA on first use (with mitmdump).

    \b
    Examples:
      NODE_EXTRA_CA_CERTS=$(pvisor ca path) claude -p "fix the test"
      SSL_CERT_FILE=$(pvisor ca path --bundle) python agent.py
    """
    where = Path(absolute(confdir, f"--confdir {confdir}")) if confdir else None
    cert = ensure_ca(where, mitmdump)
    click.echo(str(cert.with_name(CA_BUNDLE) if bundle else cert))
