"""The process runtime: one supervisor process per instance, guests in sandboxes.

supervisor.py, guest_exec.py and what they import (storage.py, userns.py, idmap.py,
safepath.py) also run as scripts (`python -I -S`, standard library only): they find each
other as siblings in this directory, so keep them together."""
