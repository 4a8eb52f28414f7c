"""What the gateway and ``switchyard keys`` share about the structured API keys file (``format``): its entries,
the salted hashes of their secrets, reading and atomic writing. It imports neither the server nor the ops client,
so that the command starts fast and the gateway needs nothing of the command."""
