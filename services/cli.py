"""The ``switchyard`` command: one Typer app that each package adds its commands to."""

from __future__ import annotations

import typer

from exporter import cli as exporter_cli
from services.gateway import cli as gateway_cli
from services.ops import models_cli, tune_cli
from services.tritonlocal import cli as triton_cli

app = typer.Typer(
    name="switchyard",
    help="Export PyTorch models to a Triton model repository and serve them behind a KServe v2 gateway.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
exporter_cli.register(app)
gateway_cli.register(app)
tune_cli.register(app)
models_cli.register(app)
triton_cli.register(app)


def main() -> None:
    app()
