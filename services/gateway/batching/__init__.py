"""Forming and running batches: the embedded backend's dynamic batcher (``config.pbtxt``'s ``dynamic_batching``),
its priority queue and its deadlines. See ``docs/architecture.md`` ("Batching")."""
