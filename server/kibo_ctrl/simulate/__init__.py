"""Deterministic simulation of the whole engine (issue 17): one thread, one event loop on a
virtual clock, one seeded random source, the real engine on a real SQLite store, faults at
random points and invariants checked after every step. `python -m kibo_ctrl.simulate`."""
