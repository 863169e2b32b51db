"""The engine: command handling, the record-writing steps, and the loops (scheduler,
controller, expiry, node agent) that drive the store towards what is desired.

It talks to the store and the runtimes only through their protocols (store/base.py,
runtime/base.py); the concrete adapters are wired in app.py."""
