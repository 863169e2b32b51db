"""Transports: parse wire requests, call the API, render responses. No rules live here."""
