"""``switchyard console``: the ops console's sign-in link, ``<gateway>/admin/ui#token=...``. The token rides in the
URL fragment, which a browser never sends to a server; the page signs in with it and removes it from the address bar
and the tab's history at once (docs/ops-console.md). Only typer and the standard library: the root command imports
this at startup."""

from __future__ import annotations

import webbrowser
from typing import Annotated, NoReturn
from urllib.parse import quote, urlsplit

import typer

from services.ops.calls import DEFAULT_URL, EXIT_ACCESS, EXIT_API, Token, Url

__all__ = ["register", "sign_in_link"]

CONSOLE_PATH = "/admin/ui"

Open = Annotated[bool, typer.Option("--open", help="Also open the link in the default web browser.")]


def register(app: typer.Typer) -> None:
    app.command("console")(console)


def sign_in_link(url: str, token: str) -> str:
    """The console's address on the gateway at ``url`` with ``token`` in the fragment, percent-encoded (a ``+`` or
    ``&`` in a token must reach the page as itself). Raises ``ValueError`` naming a ``url`` that is no HTTP address."""
    # "host:port" is what people type, as `switchyard models --url` accepts it.
    base = (url if "://" in url else f"http://{url}").rstrip("/")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"--url must be the gateway's HTTP address, like {DEFAULT_URL}; got {url!r}")
    return f"{base}{CONSOLE_PATH}#token={quote(token, safe='')}"


def console(url: Url = DEFAULT_URL, token: Token = None, open_browser: Open = False) -> None:
    """Print the ops console's sign-in link (the admin token in the URL fragment, never sent to a server)."""
    if not token:
        _fail("no admin token: give --token or set SWITCHYARD_ADMIN_TOKEN (the gateway's admin token)", EXIT_ACCESS)
    try:
        link = sign_in_link(url, token)
    except ValueError as exc:
        _fail(str(exc), EXIT_ACCESS)
    typer.echo(link)
    # stderr: `$(switchyard console)` in a script gets the link alone.
    typer.echo("The link holds the admin token: open it yourself, do not share it.", err=True)
    if open_browser and not webbrowser.open(link):
        _fail("no web browser could be started here: open the link above in one", EXIT_API)


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)
