"""Runs the app under uvicorn (uvloop + httptools) with gRPC on the same event loop."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from services.gateway.app import create_app, preflight
from services.gateway.backends.triton import ConfigTransform
from services.gateway.settings import Settings


def uvicorn_config(settings: Settings, config_transform: ConfigTransform | None = None) -> uvicorn.Config:
    return uvicorn.Config(
        create_app(settings, config_transform=config_transform),
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level=settings.log_level,
        access_log=settings.access_log,
    )


def serve(settings: Settings, config_transform: ConfigTransform | None = None) -> None:
    """Raises ``RepositoryError`` / ``StateError`` (one line each) when the gateway cannot start."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(preflight(settings))
    uvicorn.Server(uvicorn_config(settings, config_transform)).run()
