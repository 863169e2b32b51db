// Package kibotos is the Go SDK for kibo: a client over the gRPC stubs generated from
// proto/ (package ctrlv1, github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1) and the helpers
// every caller needs.
//
//   - New connects (address, TLS, a bearer token from WithToken, $KIBO_TOKEN or, for a
//     loopback server, the local server's admin token: DiscoverToken, the rule of the Python
//     SDK and of the kibo command line).
//   - NewCommandID makes the idempotency key of a command request.
//   - Settle resends the identical command request until the command is terminal.
//   - Client.WaitWorkspace and Client.WaitWorkspaceDeleted follow WatchWorkspace, reconnecting
//     when the stream breaks, until the command is terminal and the workspace steady.
//   - Errors are typed: errors.As(err, &kibotos.ConflictError{}) and friends, each carrying the
//     kibo.ctrl.v1.ErrorDetail (reason, field, workspace state, hint) of the status details.
//   - The data plane, with a credential from Client.IssueDataPlaneCredential: Client.Run, and
//     Client.StartWorkspaceProcess / ConnectWorkspaceProcess, which give a *Process (Recv of
//     typed events, SendInput, Signal, Resize, Connect); Client.UploadFile and
//     Client.DownloadFile (any size, io.Reader and io.Writer, resumed after a broken call),
//     UploadArchive and DownloadArchive for directories as tar streams; and
//     Client.WatchWorkspaceDirectory.
//
// The raw stubs are Client.Workspaces, Client.Observation, Client.Volumes, Client.DataPlane
// and Client.Simulator; they send the token too, and their errors are typed the same way
// (status.FromError and status.Code still work on them).
package kibotos
