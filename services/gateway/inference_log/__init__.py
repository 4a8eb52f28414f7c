"""The inference log: every sampled request and its answer become one record (``services/inferlog/format.py``),
written off the request path to the sink ``SWITCHYARD_INFERENCE_LOG`` names (JSON-lines files, a Redis stream or
CloudEvents over HTTP).

``records`` builds a record from an ``Exchange``, ``sinks`` stores records, ``writer`` (``InferenceLog``) samples,
queues and writes them on a thread of its own. A foundation part: it imports only ``tensors`` and the shared
record format."""

from services.gateway.inference_log.records import Exchange, LogPolicy, build_record
from services.gateway.inference_log.sinks import Sink, SinkError, open_sink
from services.gateway.inference_log.writer import InferenceLog

__all__ = ["Exchange", "InferenceLog", "LogPolicy", "Sink", "SinkError", "build_record", "open_sink"]
