"""The ``switchyard`` command: one Typer app that each package adds its commands to."""

from __future__ import annotations

import typer

from exporter import cli as exporter_cli

app = typer.Typer(
    name="switchyard",
    help="Export PyTorch models to a Triton model repository and serve them behind a KServe v2 gateway.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
exporter_cli.register(app)

try:  # the gateway adds `serve`; keep `export` usable even if the gateway's extras fail to import
    from services.gateway import cli as gateway_cli
except ImportError as exc:  # pragma: no cover - only when the gateway package is absent
    _gateway_import_error = exc

    @app.command()
    def serve() -> None:
        """Run the gateway (not available: see the error)."""
        typer.echo(f"gateway not available: {_gateway_import_error}", err=True)
        raise typer.Exit(2)
else:
    gateway_cli.register(app)


def main() -> None:
    app()
