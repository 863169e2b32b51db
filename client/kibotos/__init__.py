"""kibotos: the Python SDK for kibo."""
