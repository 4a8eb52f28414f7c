"""``switchyard serve``: run the gateway."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command()(serve)


def serve(
    ctx: typer.Context,
    repository: Annotated[Path, typer.Option(help="Model repository to serve.", envvar="SWITCHYARD_REPOSITORY")] = Path(
        "model_repository"
    ),
    backend: Annotated[
        str, typer.Option(help="embedded (in-process) or triton.", envvar="SWITCHYARD_BACKEND")
    ] = "embedded",
    triton_url: Annotated[
        str, typer.Option(help="Triton gRPC endpoint for --backend triton.", envvar="SWITCHYARD_TRITON_URL")
    ] = "127.0.0.1:8101",
    triton_http_url: Annotated[
        str,
        typer.Option(help="Triton HTTP endpoint: inference calls go there (cheaper than gRPC); empty: gRPC.",
                     envvar="SWITCHYARD_TRITON_HTTP_URL"),
    ] = "",
    triton_local_cpu: Annotated[
        bool,
        typer.Option(help="Triton is the local CPU build (`switchyard triton`): load python-backend configs.",
                     envvar="SWITCHYARD_TRITON_LOCAL_CPU"),
    ] = False,
    host: Annotated[str, typer.Option(help="Interface to bind.", envvar="SWITCHYARD_HOST")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port (KServe v2 REST, /metrics).", envvar="SWITCHYARD_PORT")] = 8000,
    grpc_port: Annotated[
        str,
        typer.Option(help="gRPC port (KServe v2 GRPCInferenceService); off: no gRPC listener.",
                     envvar="SWITCHYARD_GRPC_PORT"),
    ] = "8001",
    workers: Annotated[
        int,
        typer.Option(help="Worker processes sharing the ports (one event loop each); 0: one per core.",
                     envvar="SWITCHYARD_WORKERS", min=0),
    ] = 1,
) -> None:
    """Serve the repository's models over KServe v2 HTTP and gRPC.

    The other settings (threads, limits, batching, Triton, state) come from SWITCHYARD_* environment variables:
    `switchyard settings` lists them all with their defaults, as does docs/settings.md.
    """
    # Imported here, not at the top: every `switchyard` command loads this module, and the server's imports (the
    # whole application) would cost each of them about a second.
    from pydantic import ValidationError

    from services.gateway.app import BackendNotImplemented
    from services.gateway.backends.triton import ConfigTransform
    from services.gateway.repository import RepositoryError
    from services.gateway.security import TlsError
    from services.gateway.server import PortUnavailable
    from services.gateway.server import serve as run_server
    from services.gateway.settings import Settings
    from services.gateway.shaping.keys import ApiKeysError
    from services.gateway.shaping.limits import LimitsError
    from services.gateway.state import StateError
    from services.gateway.tracing.setup import TracingError

    if backend not in ("embedded", "triton"):
        raise typer.BadParameter("choose embedded or triton", param_hint="--backend")
    if not repository.is_dir():
        found = "is not a folder" if repository.exists() else "does not exist"
        _error(
            ctx,
            f"the model repository {repository} ({repository.resolve()}) {found}: give SWITCHYARD_REPOSITORY your "
            "repository's folder (`switchyard export` writes one), or run `make models` in the project's checkout for "
            "the examples'",
        )
        raise typer.Exit(2)
    try:
        settings = Settings(
            repository=repository,
            backend=backend,  # type: ignore[arg-type]
            triton_url=triton_url,
            triton_http_url=triton_http_url,
            host=host,
            port=port,
            grpc_port=grpc_port,  # type: ignore[arg-type]  # "off" or a number: the setting reads it
            workers=workers,
        )
    except ValidationError as exc:
        for problem in exc.errors():
            if problem["loc"]:  # one variable's value
                name = "SWITCHYARD_" + "_".join(str(part) for part in problem["loc"]).upper()
                _error(ctx, f"{name}: {problem['msg']} (got {problem.get('input')!r})")
            else:  # a rule across variables: its message names them
                _error(ctx, str(problem["msg"]).removeprefix("Value error, "))
        raise typer.Exit(2) from None
    transform: ConfigTransform | None = None
    if triton_local_cpu:
        # The dev-only launcher's twin configs; a serving node never imports services.tritonlocal.
        from services.tritonlocal.derive import derive_config

        transform = derive_config
    try:
        if settings.workers == 1:
            run_server(settings, transform)
            return
        from services.gateway.server import check_startup
        from services.gateway.workers.supervisor import supervise

        check_startup(settings)  # one clear line before any worker starts, as with one process
        code = supervise(settings, transform)
    except (
        BackendNotImplemented, RepositoryError, StateError, ApiKeysError, LimitsError, TlsError, TracingError,
        PortUnavailable,
    ) as exc:
        _error(ctx, str(exc))
        raise typer.Exit(2) from exc
    if code:
        raise typer.Exit(code)


def _error(ctx: typer.Context, message: str) -> None:
    """One line on stderr; each variable the message names that one of serve's options also sets is named with the
    option (``SWITCHYARD_PORT / --port``): the value may have come from either."""
    flags = {param.envvar: param.opts[0] for param in ctx.command.params if isinstance(param.envvar, str)}

    def with_option(found: re.Match[str]) -> str:
        flag = flags.get(found[0])
        return f"{found[0]} / {flag}" if flag else found[0]

    typer.echo(f"error: {re.sub(r'SWITCHYARD_[A-Z0-9_]+', with_option, message)}", err=True)
