"""What the gateway and the ops commands share about the inference log: a record's JSON form (``format``). The
gateway writes records (``services/gateway/inference_log/``); ``switchyard replay`` and an activation's replay
check read them back. It imports neither the server nor the ops client."""
