"""Mutations of the clients' side of the data plane's processes and files (issue 29, part D): what
the Python SDK makes of a workspace's tar stream, how its credential follows the workspace, how
its transfers survive a broken call, and what `kibo workspace shell` does to the local terminal.

The SDK is written once in client/kibotos/aio_access.py and generated into access.py (the drift
test keeps them equal); the system tests drive the blocking form, so the mutations are of
access.py."""

from tests.mutations.base import Mutation

_COMMON = "client/kibotos/access_common.py"
_ACCESS = "client/kibotos/access.py"
_TERMINAL = "client/kibo_cli/workspace_processes.py"
_TAR = "tests/unit/test_sdk_tar_streams.py"
_RESUME = "tests/system/test_data_plane_resume.py"
_SHELL = "tests/system/test_data_plane_shell.py"

MUTATIONS = [
    Mutation(
        claim="A directory downloaded with kibotos (files.download_dir, kibo workspace cp) writes nothing "
        "outside its target directory nor through a link, makes no hard link to a file outside it, and "
        "applies no owner or setuid bit of the workspace's tar stream",
        code=_COMMON,
        find="archive.extractall(str(self.directory), filter=_member_filter)",
        replace='archive.extractall(str(self.directory), filter="fully_trusted")',
        tests=(
            f"{_TAR}::test_a_hostile_entry_is_refused_and_nothing_lands_outside[dot-dot]",
            f"{_TAR}::test_a_hostile_entry_is_refused_and_nothing_lands_outside[through-a-link]",
            f"{_TAR}::test_a_hostile_entry_is_refused_and_nothing_lands_outside[hard-link-out]",
            f"{_TAR}::test_owners_and_setuid_bits_of_the_stream_are_not_applied",
        ),
    ),
    Mutation(
        claim="kibotos' workspace access renews its data-plane credential only after a new start of the "
        "workspace: a revoke within the same execution is never undone by the SDK",
        code=_ACCESS,
        find="            raise error  # the same execution: a revoke (or a stop and a delete) meant to cut this",
        replace="            pass",
        tests=(f"{_RESUME}::test_the_credential_is_renewed_after_a_new_start_and_never_after_a_revoke",),
    ),
    Mutation(
        claim="An upload whose answer was lost goes on from the offset the server names: the file arrives "
        "whole, each byte once",
        code=_ACCESS,
        find="                if taken is None or not offset < taken <= offset + len(part):",
        replace="                if True:",
        tests=(f"{_RESUME}::test_an_upload_goes_on_from_the_offset_the_server_names",),
    ),
    Mutation(
        claim="A file download whose stream broke resumes where it was, the file unchanged",
        code=_ACCESS,
        find="                if archive or isinstance(error, WrongPortError):",
        replace="                if True:",
        tests=(f"{_RESUME}::test_a_broken_download_resumes_where_it_was",),
    ),
    Mutation(
        claim="An upload that fails on the client's side is cancelled: nothing of it is left in the guest, "
        "and it holds none of the workspace's 4 upload slots",
        code=_ACCESS,
        find="self._stub.CancelWorkspaceUpload, dp.CancelWorkspaceUploadRequest(upload_id=upload_id)",
        replace='self._stub.CancelWorkspaceUpload, dp.CancelWorkspaceUploadRequest(upload_id="kibo-upload-0")',
        tests=("tests/system/test_data_plane_access.py::test_files_by_the_sdk",),
    ),
    Mutation(
        claim="kibo workspace shell puts the local terminal in raw mode: every key, Ctrl-C included, goes to the guest",
        code=_TERMINAL,
        find="        tty.setraw(fd, termios.TCSANOW)",
        replace="        pass",
        tests=(f"{_SHELL}::test_a_shell_in_a_terminal",),
    ),
    Mutation(
        claim="kibo workspace shell resizes the guest's terminal when the local one is resized (SIGWINCH)",
        code=_TERMINAL,
        find="    loop.add_signal_handler(signal.SIGWINCH, resized.set)",
        replace="    pass",
        tests=(f"{_SHELL}::test_a_shell_in_a_terminal",),
    ),
    Mutation(
        claim="kibo workspace shell restores the local terminal when it is ended by SIGTERM or SIGHUP",
        code=_TERMINAL,
        find="        loop.add_signal_handler(number, on_signal, int(number))",
        replace="        pass",
        tests=(f"{_SHELL}::test_exec_tty_and_a_shell_ended_by_sigterm",),
    ),
]
