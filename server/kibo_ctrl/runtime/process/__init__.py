"""The process runtime: one supervisor process per instance (or, with `--supervisor node`,
one node supervisor holding every ready guest), guests in sandboxes.

supervisor.py, node_supervisor.py, guest_exec.py and what they import (storage.py,
userns.py, idmap.py, safepath.py, supervisor_handover.py, ...) also run as scripts (`python
-I -S`, standard library only): they find each other as siblings in this directory, so
keep them together."""
