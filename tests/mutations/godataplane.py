"""Mutations of the Go SDK's data plane (issue 29, slice E: sdk/go/kibotos/files.go and
processes.go): what its transfers promise (resumed at the right offset, never a mix of two
versions of a file or a file cut short taken as whole, nothing left in the guest by a failed
upload) and what its process helpers send (input within the server's bound, the guest's signal
numbers). Each is caught by a Go test run against a real process-runtime server
(tests/system/test_go_sdk_data_plane.py: one test ID per Go test)."""

from tests.mutations.base import Mutation

_FILES = "sdk/go/kibotos/files.go"
_PROCESSES = "sdk/go/kibotos/processes.go"
_GO = "tests/system/test_go_sdk_data_plane.py::test_go_data_plane"
_RESUME = f"{_GO}[TestDataPlaneTransferResume]"

MUTATIONS = [
    Mutation(
        claim="The Go SDK's UploadFile goes on after a lost answer from the offset the server's refusal of the "
        "resent part names, and the guest's file has the sha256 of what was sent",
        code=_FILES,
        find="if errors.As(err, &conflict) && breaks > 0 {",
        replace="if false && errors.As(err, &conflict) && breaks > 0 {",
        tests=(_RESUME,),
    ),
    Mutation(
        claim="The Go SDK's DownloadFile resumes a broken download from the bytes already written",
        code=_FILES,
        find="Path: path, Offset: written})",
        replace="Path: path, Offset: 0})",
        tests=(_RESUME,),
    ),
    Mutation(
        claim="The Go SDK's DownloadFile never resumes over a file that changed while the stream was broken "
        "(ConflictError, not a mix of two versions)",
        code=_FILES,
        find="} else if download.Info.GetSize() != info.GetSize() || !proto.Equal(download.Info.GetModifyTime(), "
        "info.GetModifyTime()) {",
        replace="} else if false && (download.Info.GetSize() != info.GetSize() || "
        "!proto.Equal(download.Info.GetModifyTime(), info.GetModifyTime())) {",
        tests=(_RESUME,),
    ),
    Mutation(
        claim="A Go SDK download whose stream ends short of the file's described size is io.ErrUnexpectedEOF, "
        "not a shorter file",
        code=_FILES,
        find="if errors.Is(err, io.EOF) && d.expect >= 0 && d.received < d.expect {",
        replace="if false && errors.Is(err, io.EOF) && d.expect >= 0 && d.received < d.expect {",
        tests=(_RESUME,),
    ),
    Mutation(
        claim="A Go SDK upload that fails (here its reader) is cancelled: nothing of it is left in the guest",
        code=_FILES,
        find="if !finished {",
        replace="if false && !finished {",
        tests=(f"{_GO}[TestDataPlaneUploadDownload]",),
    ),
    Mutation(
        claim="The Go SDK sends process input larger than the server's 1 MiB bound in parts, in order",
        code=_PROCESSES,
        find="if len(part) > MaxProcessInput {",
        replace="if false {",
        tests=(f"{_GO}[TestDataPlanePTY]",),
    ),
    Mutation(
        claim="The Go SDK's signal constants are the guest's (Linux) numbers, whatever the client's system",
        code=_PROCESSES,
        find="SignalUsr1  Signal = 10",
        replace="SignalUsr1  Signal = 30",
        tests=(f"{_GO}[TestDataPlaneBackgroundProcessByTag]",),
    ),
]
