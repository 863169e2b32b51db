package kibotos_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	"github.com/kibo-dev/kibo/sdk/go/kibotos"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestCreateStopStartDeleteSettled(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	workspace := available(ctx, t, client)
	id := workspace.GetWorkspaceId()

	stopped, err := client.StopWorkspace(ctx, &ctrlv1.StopWorkspaceRequest{WorkspaceId: id})
	if err != nil {
		t.Fatal(err)
	}
	if got := stopped.GetCommand().GetState(); got != ctrlv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Fatalf("settled stop is %s", got)
	}
	if got := stopped.GetWorkspace().GetState(); got != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		t.Fatalf("workspace after a settled stop is %s", got)
	}
	if got := stopped.GetCommand().GetResult().GetDurability(); got != ctrlv1.StopDurability_STOP_DURABILITY_CONFIRMED {
		t.Fatalf("graceful stop durability %s", got)
	}

	start := &ctrlv1.StartWorkspaceRequest{WorkspaceId: id}
	started, err := client.StartWorkspace(ctx, start)
	if err != nil {
		t.Fatal(err)
	}
	workspace, err = client.WaitWorkspace(ctx, started.GetWorkspace(), start.GetMetadata().GetCommandId())
	if err != nil {
		t.Fatal(err)
	}
	if workspace.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Fatalf("started workspace is %s", workspace.GetState())
	}

	del := &ctrlv1.DeleteWorkspaceRequest{WorkspaceId: id}
	if _, err := client.DeleteWorkspace(ctx, del); err != nil {
		t.Fatal(err)
	}
	if err := client.WaitWorkspaceDeleted(ctx, id, del.GetMetadata().GetCommandId()); err != nil {
		t.Fatal(err)
	}
	read, err := client.GetWorkspace(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if read.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		t.Fatalf("deleted workspace reads %s", read.GetState())
	}
}

// A force stop of a STOPPED workspace is refused: FAILED_PRECONDITION with an ErrorDetail
// of reason CONFLICT, which errors.As finds as a ConflictError.
func TestForceStopConflictIsATypedError(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	id := available(ctx, t, client).GetWorkspaceId()
	if _, err := client.StopWorkspace(ctx, &ctrlv1.StopWorkspaceRequest{WorkspaceId: id}); err != nil {
		t.Fatal(err)
	}
	_, err := client.StopWorkspace(ctx, &ctrlv1.StopWorkspaceRequest{WorkspaceId: id, Mode: ctrlv1.StopMode_STOP_MODE_FORCE})
	if err == nil {
		t.Fatal("force stop of a STOPPED workspace was accepted")
	}
	var conflict kibotos.ConflictError
	if !errors.As(err, &conflict) {
		t.Fatalf("want a ConflictError, got %T: %v", err, err)
	}
	if conflict.Reason() != "CONFLICT" || conflict.Detail.GetReason() != ctrlv1.ErrorReason_ERROR_REASON_CONFLICT {
		t.Fatalf("reason %q (%s)", conflict.Reason(), conflict.Detail.GetReason())
	}
	if conflict.WorkspaceState() != "STOPPED" {
		t.Fatalf("workspace state in the detail: %q", conflict.WorkspaceState())
	}
	if conflict.Message == "" || conflict.Code != codes.FailedPrecondition {
		t.Fatalf("message %q code %s", conflict.Message, conflict.Code)
	}
	// The literal form of the issue, the base type, and the gRPC view all work on it.
	if !errors.As(err, &kibotos.ConflictError{}) {
		t.Fatal("errors.As(err, &kibotos.ConflictError{}) is false")
	}
	var api *kibotos.APIError
	if !errors.As(err, &api) || api.Reason() != "CONFLICT" {
		t.Fatalf("errors.As(*APIError): %v", api)
	}
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("status.Code = %s", status.Code(err))
	}
	var notFound kibotos.NotFoundError
	if errors.As(err, &notFound) {
		t.Fatal("a conflict is also a NotFoundError")
	}
	// The raw stub's errors are typed the same way.
	_, err = client.Workspaces().StopWorkspace(ctx, &ctrlv1.StopWorkspaceRequest{
		Metadata: &ctrlv1.CommandMetadata{CommandId: kibotos.NewCommandID("test")}, WorkspaceId: id, Mode: ctrlv1.StopMode_STOP_MODE_FORCE,
	})
	if !errors.As(err, &conflict) {
		t.Fatalf("raw stub: want a ConflictError, got %T: %v", err, err)
	}
}

func TestWatchingUntilDeleted(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	id := available(ctx, t, client).GetWorkspaceId()
	// The delete is sent once, not settled: the watch sees it through.
	commandID := kibotos.NewCommandID("test")
	if _, err := client.Workspaces().DeleteWorkspace(ctx, &ctrlv1.DeleteWorkspaceRequest{
		Metadata: &ctrlv1.CommandMetadata{CommandId: commandID}, WorkspaceId: id,
	}); err != nil {
		t.Fatal(err)
	}
	var seen []ctrlv1.WorkspaceState
	if err := client.WatchWorkspace(ctx, id, func(w *ctrlv1.Workspace) bool {
		seen = append(seen, w.GetState())
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) == 0 || seen[len(seen)-1] != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		t.Fatalf("the watch ended at %v", seen)
	}
	if err := client.WaitWorkspaceDeleted(ctx, id, commandID); err != nil {
		t.Fatal(err)
	}
}

// The first answer to a create is lost on the way back (the server executed it): Settle
// sends the identical request again and gets the same command, and only one workspace exists.
func TestResendAfterALostAnswerReturnsTheSameCommand(t *testing.T) {
	ctx := testContext(t)
	var calls, lost int32
	loseFirstAnswer := func(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if !strings.HasSuffix(method, "/CreateWorkspace") {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		atomic.AddInt32(&calls, 1)
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil && atomic.CompareAndSwapInt32(&lost, 0, 1) {
			return status.Error(codes.Unavailable, "the answer was lost on the way back")
		}
		return err
	}
	client := connect(t, kibotos.WithDialOptions(grpc.WithChainUnaryInterceptor(loseFirstAnswer)))
	label := kibotos.NewCommandID("")[:8]
	request := &ctrlv1.CreateWorkspaceRequest{Spec: &ctrlv1.WorkspaceSpec{Labels: map[string]string{"resend": label}}}
	created, err := client.CreateWorkspace(ctx, request)
	if err != nil {
		t.Fatal(err)
	}
	if atomic.LoadInt32(&calls) < 2 || atomic.LoadInt32(&lost) != 1 {
		t.Fatalf("calls %d, lost %d: the lost answer was not resent", calls, lost)
	}
	if got, want := created.GetCommand().GetCommandId(), request.GetMetadata().GetCommandId(); got != want {
		t.Fatalf("the resend answered command %q, sent %q", got, want)
	}
	matching, err := client.ListWorkspaces(ctx, &ctrlv1.ListWorkspacesRequest{Filter: `labels.resend = "` + label + `"`})
	if err != nil {
		t.Fatal(err)
	}
	if len(matching) != 1 || matching[0].GetWorkspaceId() != created.GetWorkspace().GetWorkspaceId() {
		t.Fatalf("the resend made %d workspaces", len(matching))
	}
}

// INVALID_ARGUMENT is never resent: the same request would meet it again.
func TestSettleNeverResendsAnInvalidArgument(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	calls := 0
	_, err := kibotos.Settle(ctx, kibotos.SettleOptions{}, func(ctx context.Context) (*ctrlv1.StopWorkspaceResponse, error) {
		calls++
		return client.Workspaces().StopWorkspace(ctx, &ctrlv1.StopWorkspaceRequest{
			Metadata: &ctrlv1.CommandMetadata{CommandId: "not a command id"}, WorkspaceId: "w-none",
		})
	})
	var invalid kibotos.InvalidArgumentError
	if !errors.As(err, &invalid) {
		t.Fatalf("want InvalidArgumentError, got %T: %v", err, err)
	}
	if calls != 1 || invalid.Field() == "" {
		t.Fatalf("calls %d, field %q", calls, invalid.Field())
	}
}

// A watch stream that breaks is reconnected: the wait still ends at the steady workspace.
func TestWaitReconnectsABrokenWatch(t *testing.T) {
	ctx := testContext(t)
	var broken int32
	breakFirstWatch := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		stream, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || !strings.HasSuffix(method, "/WatchWorkspace") || !atomic.CompareAndSwapInt32(&broken, 0, 1) {
			return stream, err
		}
		return brokenStream{stream}, nil
	}
	client := connect(t, kibotos.WithDialOptions(grpc.WithChainStreamInterceptor(breakFirstWatch)))
	created, err := client.Workspaces().CreateWorkspace(ctx, &ctrlv1.CreateWorkspaceRequest{
		Metadata: &ctrlv1.CommandMetadata{CommandId: kibotos.NewCommandID("test")},
	})
	if err != nil {
		t.Fatal(err)
	}
	workspace, err := client.WaitWorkspace(ctx, created.GetWorkspace(), created.GetCommand().GetCommandId())
	if err != nil {
		t.Fatal(err)
	}
	if atomic.LoadInt32(&broken) != 1 || workspace.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Fatalf("broken %d, workspace %s", broken, workspace.GetState())
	}
}

// brokenStream fails its first receive as a server going away would.
type brokenStream struct{ grpc.ClientStream }

func (brokenStream) RecvMsg(interface{}) error {
	return status.Error(codes.Unavailable, "the server went away")
}

func TestAWrongTokenSaysWhereItCameFrom(t *testing.T) {
	ctx := testContext(t)
	client := connect(t, kibotos.WithToken("not-a-token"))
	_, err := client.GetCapabilities(ctx)
	var unauthenticated kibotos.UnauthenticatedError
	if !errors.As(err, &unauthenticated) {
		t.Fatalf("want UnauthenticatedError, got %T: %v", err, err)
	}
	if !strings.Contains(err.Error(), "the token came from WithToken") {
		t.Fatalf("error does not say where the token came from: %v", err)
	}
}
