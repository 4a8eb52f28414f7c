"""Many models per node: the model cache (``SWITCHYARD_MODEL_CACHE_MB``) loads a model on its first request and
unloads the least recently used ones with no request in flight to stay within a memory budget."""
