import os

# As in kibo_ctrl/__init__.py: the tests fork servers and tools while grpc's threads run.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
