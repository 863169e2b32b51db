"""The data plane's hands in a running guest (process runtime): what runs inside it
(`guest_exec.py`, a script run in the guest's namespaces, standard library only) and the
server's side of each job, process and port.

- `guest_exec.py`: enters a guest (its cgroup, namespaces, root, uid, seccomp filter) and
  runs a command, a file operation or a process there.
- `jobs.py`: one job's output with back-pressure and bounded memory, killed on cancel.
- `ports.py`: a TCP connection to a guest's port, made in its network namespace (exposures).
"""
