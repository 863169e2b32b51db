"""Mutations of files anywhere in the guest (issue 29): the API's path checks, the volume rule
kept without a sandbox, uploads whole or not at all (staging, the commit, O_TMPFILE, a cancel's
cleanup), hostile archives refused, links kept as links, the bounds (a listing, transfers at
once, a part), an upload ID that reaches uploads only, and a revoke that ends running calls."""

from tests.mutations.base import Mutation

_SYSTEM = "tests/system/test_guest_files.py"
_UNIT = "tests/unit/test_guest_files_none.py"
_API = "server/kibo_ctrl/api/data_plane_files.py"
_FILES = "server/kibo_ctrl/runtime/process/guest_access/guest_files.py"
_TAR = "server/kibo_ctrl/runtime/process/guest_access/guest_tar.py"
_HOSTILE = f"{_SYSTEM}::test_a_hostile_archive_is_refused_whole"
_BAD_PATHS = f"{_SYSTEM}::test_bad_paths_are_refused_naming_the_field"

MUTATIONS = [
    Mutation(
        claim="A file path with a NUL byte is refused by the API with INVALID_ARGUMENT naming its field",
        code=_API,
        find='    if "\\0" in value:',
        replace="    if False:",
        tests=(f"{_BAD_PATHS}[nul]",),
    ),
    Mutation(
        claim="A file path longer than PATH_MAX (4095 bytes) is refused with INVALID_ARGUMENT naming its field",
        code=_API,
        find="    if len(value) > MAX_PATH_BYTES or len(value.encode()) > MAX_PATH_BYTES:",
        replace="    if False:",
        tests=(f"{_BAD_PATHS}[over-PATH_MAX]",),
    ),
    Mutation(
        claim="A relative file path is refused by the API with INVALID_ARGUMENT naming its field",
        code=_API,
        find='    if not value.startswith("/"):\n        raise InvalidArgument(f"{field} must be',
        replace='    if False:\n        raise InvalidArgument(f"{field} must be',
        tests=(f"{_BAD_PATHS}[relative]",),
    ),
    Mutation(
        claim="The guest's root is never removed through RemoveWorkspacePath",
        code=_API,
        find='        if posixpath.normpath(path) in ("/", "//"):',
        replace="        if False:",
        tests=(f"{_SYSTEM}::test_the_guests_root_is_not_removed",),
    ),
    Mutation(
        claim=(
            "Without a sandbox (--sandbox none: guest paths are host paths) every file call keeps the "
            "volume-mount rule: nothing outside the workspace's volumes is reached"
        ),
        code=_FILES,
        find='        if spec["isolation"] != "none":\n            found[key] = path',
        replace="        if True:\n            found[key] = path",
        tests=(f"{_UNIT}::test_sandbox_none_keeps_the_volume_rule",),
    ),
    Mutation(
        claim=(
            "An upload is put in place only at the server's commit after its last part, never at the end of "
            "its input alone (what a server that died leaves)"
        ),
        code=_FILES,
        find='    commit = _await_commit if job.get("commit") else _no_wait',
        replace="    commit = _no_wait",
        tests=(
            f"{_UNIT}::test_an_upload_is_put_in_place_at_its_commit_only",
            f"{_UNIT}::test_an_upload_whose_server_is_gone_is_not_put_in_place",
        ),
    ),
    Mutation(
        claim=(
            "A file upload killed before its commit (a revoke, a server gone) leaves nothing in the guest: "
            "the file it wrote had no name (O_TMPFILE)"
        ),
        code=_FILES,
        find="os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC",
        replace="os.O_DIRECTORY | os.O_RDWR | os.O_CLOEXEC",
        tests=(
            f"{_UNIT}::test_a_killed_file_upload_leaves_nothing",
            f"{_SYSTEM}::test_a_revoke_ends_a_running_upload_and_leaves_nothing",
        ),
    ),
    Mutation(
        claim="A cancelled upload (SIGTERM) removes what it made: nothing of it is left in the guest",
        code=_FILES,
        find="    signal.signal(signal.SIGTERM, cancel)\n",
        replace="    signal.signal(signal.SIGTERM, signal.SIG_DFL)\n",
        tests=(f"{_SYSTEM}::test_a_cancelled_upload_leaves_nothing",),
    ),
    Mutation(
        claim="A download of a FIFO, device or socket is refused (never a hang, never an endless stream)",
        code=_FILES,
        find="        if not stat.S_ISREG(st.st_mode):\n            raise Invalid(",
        replace="        if False:\n            raise Invalid(",
        tests=(f"{_SYSTEM}::test_upload_errors_are_the_guests",),
    ),
    Mutation(
        claim="A directory listing stops at 10,000 entries (and 3 MiB) and says it was truncated",
        code=_FILES,
        find="                    if count > MAX_ENTRIES or written > MAX_LIST_BYTES:",
        replace="                    if False:",
        tests=(f"{_SYSTEM}::test_a_listing_is_bounded",),
    ),
    Mutation(
        claim="An uploaded archive's entry with '..' is refused, and the whole upload with it",
        code=_TAR,
        find='    if ".." in parts:',
        replace="    if False:",
        tests=(f"{_HOSTILE}[dot-dot]", f"{_HOSTILE}[hard-link-out-of-staging]"),
    ),
    Mutation(
        claim="An uploaded archive's entry with an absolute name is refused, and the whole upload with it",
        code=_TAR,
        find='    if name.startswith("/"):',
        replace="    if False:",
        tests=(f"{_HOSTILE}[absolute]",),
    ),
    Mutation(
        claim=(
            "An uploaded archive never writes through a symlink (its own or one the guest planted): "
            "each directory on an entry's way is opened O_NOFOLLOW"
        ),
        code=_TAR,
        find="child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)",
        replace="child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)",
        tests=(f"{_HOSTILE}[through-a-symlink]",),
    ),
    Mutation(
        claim="An uploaded archive with a device or a FIFO is refused whole",
        code=_TAR,
        find="            if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):",
        replace="            if False:",
        tests=(f"{_HOSTILE}[fifo]", f"{_HOSTILE}[device]"),
    ),
    Mutation(
        claim=(
            "A refused archive leaves nothing: it is unpacked into a staging directory, merged into the "
            "target only once all of it was accepted"
        ),
        code=_TAR,
        find="                        _extract(cast(BinaryIO, source), stage)",
        replace="                        _extract(cast(BinaryIO, source), target)",
        tests=(f"{_HOSTILE}[dot-dot]", f"{_HOSTILE}[absolute]"),
    ),
    Mutation(
        claim="A directory downloaded as tar keeps its symlinks as links (never followed)",
        code=_TAR,
        find="    st = entry.stat(follow_symlinks=False)\n    info = tarfile.TarInfo(name)",
        replace="    st = entry.stat()\n    info = tarfile.TarInfo(name)",
        tests=(f"{_SYSTEM}::test_a_tree_with_symlinks_out_and_back_as_tar",),
    ),
    Mutation(
        claim="A revoke ends a running download and watch at once (their jobs killed), with UNAUTHENTICATED",
        code=_API,
        find='        items = runtime.guest_job(instance_id, job, b"", 0.0, session.stop)',
        replace='        items = runtime.guest_job(instance_id, job, b"", 0.0, None)',
        tests=(f"{_SYSTEM}::test_revoke_ends_a_running_watch_and_download",),
    ),
    Mutation(
        claim="At most 4 downloads and 4 watches of one workspace run at once on a server (RESOURCE_EXHAUSTED)",
        code=_API,
        find="        if used >= self._limit:",
        replace="        if False:",
        tests=(f"{_SYSTEM}::test_concurrent_downloads_and_watches_are_capped",),
    ),
    Mutation(
        claim="An upload ID reaches uploads only: a process's tag is refused, its input never written",
        code=_API,
        find="    if not value.startswith(UPLOAD_PREFIX) or len(hexes) != UPLOAD_HEX or not set(hexes) <= HEX:",
        replace="    if False:",
        tests=(f"{_SYSTEM}::test_an_upload_id_reaches_uploads_only",),
    ),
    Mutation(
        claim="An upload's part is at most 2 MiB (INVALID_ARGUMENT naming data)",
        code=_API,
        find="        if len(request.data) > MAX_PART_BYTES:",
        replace="        if False:",
        tests=(f"{_SYSTEM}::test_upload_errors_are_the_guests",),
    ),
    Mutation(
        claim="A watch whose events the guest's kernel dropped (its queue overflowed) says so",
        code="server/kibo_ctrl/runtime/process/guest_access/guest_watch.py",
        find="""                    self.out.append(b'{"overflow": true}\\n')""",
        replace="                    pass",
        tests=(f"{_SYSTEM}::test_a_watch_that_is_not_read_says_it_overflowed",),
    ),
]
