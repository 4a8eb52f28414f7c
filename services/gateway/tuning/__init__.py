"""``switchyard tune``: finds the dynamic-batching and instance settings that meet a p99 SLO at the highest
throughput, by loading trial configs beside the serving model on the live backend and driving them closed-loop.

The gateway side is ``service`` (with ``search``, ``hosts``, ``drive``, ``publish``); the CLI side, which only reads
the admin API's JSON, is ``views`` and ``plot``. Import the modules themselves: this package imports nothing, so
the CLI does not load the gateway to print a table.
"""

__all__ = [
    "candidates",
    "curve",
    "drive",
    "hosts",
    "options",
    "plot",
    "publish",
    "requests",
    "results",
    "search",
    "service",
    "space",
    "views",
]
