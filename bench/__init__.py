"""kibo's benchmark: `bench/run [--quick] [--json FILE]` (see bench/README.md)."""
