"""The ``switchyard`` command: one Typer app that each package adds its commands to."""

from __future__ import annotations

import typer

from exporter import cli as exporter_cli
from services import help_layout
from services.gateway import cli as gateway_cli
from services.gateway import settings_cli
from services.ops import console_cli, keys_cli, models_cli, replay_cli, tune_cli
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
settings_cli.register(app)
tune_cli.register(app)
models_cli.register(app)
console_cli.register(app)
replay_cli.register(app)
keys_cli.register(app)
triton_cli.register(app)
# After every command and group is added: the plain layout reads whole at 80 columns, rich's panels cut it.
help_layout.use_plain_help(app)


def main() -> None:
    app()
