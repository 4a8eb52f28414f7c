"""The embedded backend as the gateway's settings shape it (threads, spinning, batch forming, queue bound): the
serving backend and the tuner's trial host are built here, from the same settings."""

from __future__ import annotations

import os

from services.gateway.backends.embedded import EmbeddedBackend
from services.gateway.metrics import GatewayMetrics
from services.gateway.repository import Catalog
from services.gateway.settings import Settings

__all__ = ["embedded_backend"]


def embedded_backend(
    catalog: Catalog, settings: Settings, *, metrics: GatewayMetrics | None, inline_batches: bool
) -> EmbeddedBackend:
    """``metrics``: None keeps the backend's models out of the metrics. ``inline_batches``: whether a batch expected
    to take less than ``settings.inline_batch_us`` runs on the event loop's thread (otherwise every batch goes to the
    version's worker threads)."""
    return EmbeddedBackend(
        catalog,
        metrics=metrics,
        intra_op_threads=settings.intra_op_threads,
        spinning=settings.intra_op_spinning,
        adaptive_delay=settings.batch_adaptive_delay,
        max_queue=settings.embedded_max_queue,
        inline_below_s=settings.inline_batch_us / 1e6 if inline_batches else 0.0,
        # N workers each hold their own sessions: each takes its share, so that they do not oversubscribe the cores.
        cores=max(1, (os.cpu_count() or 1) // max(settings.workers, 1)),
        gpu_fallback=settings.gpu_fallback,
    )
