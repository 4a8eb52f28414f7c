"""OpenTelemetry tracing of inference requests: configured from the standard ``OTEL_*`` variables (``setup``), one
server span per request with children for where its time went (``spans``). Foundation layer: the edges, the data
plane and the backends record into it; it imports nothing of theirs."""
