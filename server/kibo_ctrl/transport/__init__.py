"""Transports: decode wire bytes, authenticate, call the API (api/), map domain errors to
status codes (errors.py). No rules live here."""
