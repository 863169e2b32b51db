"""Runtimes: the only code that touches a sandbox. The engine sees the protocols in base.py;
sim/ and process/ are the adapters, chosen in app.py."""
