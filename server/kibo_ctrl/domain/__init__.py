"""The domain: records, rules as data, status derivation, cleanup, errors, request checks.

Pure: no I/O, no asyncio, no store, no runtime, no wire types (tests/unit/test_architecture.py)."""
