"""Proof that the tests bite: each protection that SECURITY.md's claims table names, removed in
a scratch copy, must make the test that proves it fail (`python -m tests.mutations`)."""
