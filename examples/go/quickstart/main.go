// Command quickstart drives a kibo workspace through its lifecycle with grpc-go, like the
// Go SDK example in the docs: stop it with settling, start it and wait, delete it and wait
// until DELETED. Before that it shows how a rejection reads: starting an AVAILABLE
// workspace is FAILED_PRECONDITION with a kibo.ctrl.v1.ErrorDetail (reason CONFLICT) and a
// google.rpc.ErrorInfo in the status details.
//
// Build it with ../build.sh (offline, GOPATH mode, Debian's Go packages), then:
//
//	quickstart -addr 127.0.0.1:50051 -token "$(cat ~/.local/share/kibo/admin.token)"
//
// The token (default: $KIBO_TOKEN) is sent as `authorization: Bearer TOKEN` on every call.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	ctrlv1 "github.com/kibo-dev/kibo/gen/go/kibo/ctrl/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// SettleOptions: how long and how often to resend a command that is still executing.
type SettleOptions struct {
	Timeout  time.Duration
	Interval time.Duration
}

// commandResponse is what every command RPC answers: the workspace and the command.
type commandResponse interface {
	GetWorkspace() *ctrlv1.Workspace
	GetCommand() *ctrlv1.WorkspaceCommand
}

// Settle calls `call` (which must send the identical request, same command ID, each time)
// until the command's state is terminal. A resend never executes the command again.
func Settle[R commandResponse](ctx context.Context, options SettleOptions, call func(context.Context) (R, error)) (R, error) {
	ctx, cancel := context.WithTimeout(ctx, options.Timeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		response, err := call(ctx)
		if err != nil {
			return response, err
		}
		command := response.GetCommand()
		switch command.GetState() {
		case ctrlv1.CommandState_COMMAND_STATE_SUCCEEDED:
			fmt.Printf("command %s SUCCEEDED after %d call(s)\n", command.GetCommandId(), attempt)
			return response, nil
		case ctrlv1.CommandState_COMMAND_STATE_FAILED:
			return response, fmt.Errorf("command %s failed: %s", command.GetCommandId(), command.GetError().GetMessage())
		}
		fmt.Printf("command %s is %s: resending\n", command.GetCommandId(), command.GetState())
		select {
		case <-ctx.Done():
			return response, fmt.Errorf("command %s not settled: %w", command.GetCommandId(), ctx.Err())
		case <-time.After(options.Interval):
		}
	}
}

// NewCommandID returns a fresh command ID such as "example/6f1c...".
func NewCommandID(prefix string) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return fmt.Sprintf("%s/%x-%x-%x-%x-%x", prefix, b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// WaitWorkspace waits until the command is terminal, then watches the workspace until it is
// steady (AVAILABLE, STOPPED, FAILED or DELETED) and returns it.
func WaitWorkspace(ctx context.Context, client ctrlv1.WorkspaceServiceClient, workspace *ctrlv1.Workspace, commandID string) (*ctrlv1.Workspace, error) {
	for {
		reply, err := client.GetWorkspaceCommand(ctx, &ctrlv1.GetWorkspaceCommandRequest{CommandId: commandID})
		if err != nil {
			return nil, err
		}
		state := reply.GetCommand().GetState()
		if state == ctrlv1.CommandState_COMMAND_STATE_FAILED {
			return nil, fmt.Errorf("command %s failed: %s", commandID, reply.GetCommand().GetError().GetMessage())
		}
		if state == ctrlv1.CommandState_COMMAND_STATE_SUCCEEDED {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return watch(ctx, client, workspace.GetWorkspaceId(), func(w *ctrlv1.Workspace) bool {
		switch w.GetState() {
		case ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED,
			ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED:
			return true
		}
		return false
	})
}

// WaitWorkspaceDeleted follows WatchWorkspace to its end: the server sends the DELETED
// snapshot and then closes the stream.
func WaitWorkspaceDeleted(ctx context.Context, client ctrlv1.WorkspaceServiceClient, workspaceID string) error {
	stream, err := client.WatchWorkspace(ctx, &ctrlv1.WatchWorkspaceRequest{WorkspaceId: workspaceID})
	if err != nil {
		return err
	}
	var last *ctrlv1.Workspace
	for {
		message, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		last = message.GetWorkspace()
	}
	if last.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
		return fmt.Errorf("watch of %s ended at %s", workspaceID, last.GetState())
	}
	return nil
}

func watch(ctx context.Context, client ctrlv1.WorkspaceServiceClient, workspaceID string, done func(*ctrlv1.Workspace) bool) (*ctrlv1.Workspace, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.WatchWorkspace(ctx, &ctrlv1.WatchWorkspaceRequest{WorkspaceId: workspaceID})
	if err != nil {
		return nil, err
	}
	for {
		message, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("watching %s: %w", workspaceID, err)
		}
		if done(message.GetWorkspace()) {
			return message.GetWorkspace(), nil
		}
	}
}

// describe prints the kibo ErrorDetail and the generic ErrorInfo of a rejection.
func describe(err error) (codes.Code, *ctrlv1.ErrorDetail) {
	st, ok := status.FromError(err)
	if !ok {
		log.Fatalf("not a gRPC status: %v", err)
	}
	var detail *ctrlv1.ErrorDetail
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *ctrlv1.ErrorDetail:
			detail = d
			fmt.Printf("error detail: reason=%s workspace_state=%s hint=%q\n", d.GetReason(), d.GetWorkspaceState(), d.GetHint())
		case *errdetails.ErrorInfo:
			fmt.Printf("error info: reason=%s domain=%s\n", d.GetReason(), d.GetDomain())
		case error:
			fmt.Printf("undecodable detail: %v\n", d)
		}
	}
	return st.Code(), detail
}

// bearer sends a kibo token with every call. kibo-ctrl serve listens without TLS by default,
// so it does not require transport security (use TLS for a server on another machine).
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "kibo-ctrl gRPC address")
	token := flag.String("token", os.Getenv("KIBO_TOKEN"), "bearer token (default $KIBO_TOKEN)")
	timeout := flag.Duration("timeout", 60*time.Second, "deadline for the whole run")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	options := []grpc.DialOption{grpc.WithInsecure(), grpc.WithBlock()}
	if *token != "" {
		options = append(options, grpc.WithPerRPCCredentials(bearer(*token)))
	}
	conn, err := grpc.DialContext(ctx, *addr, options...)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := ctrlv1.NewWorkspaceServiceClient(conn)
	settleOptions := SettleOptions{Timeout: 30 * time.Second, Interval: 50 * time.Millisecond}

	// A workspace to work with.
	createID := NewCommandID("example")
	createRequest := &ctrlv1.CreateWorkspaceRequest{
		Metadata: &ctrlv1.CommandMetadata{CommandId: createID},
		Spec:     &ctrlv1.WorkspaceSpec{Labels: map[string]string{"example": "go"}},
	}
	created, err := Settle(ctx, settleOptions, func(ctx context.Context) (*ctrlv1.CreateWorkspaceResponse, error) {
		return client.CreateWorkspace(ctx, createRequest)
	})
	if err != nil {
		log.Fatal(err)
	}
	workspaceID := created.GetWorkspace().GetWorkspaceId()
	if _, err := WaitWorkspace(ctx, client, created.GetWorkspace(), createID); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("created %s\n", workspaceID)

	// Starting an AVAILABLE workspace is rejected: FAILED_PRECONDITION, reason CONFLICT.
	_, err = client.StartWorkspace(ctx, &ctrlv1.StartWorkspaceRequest{
		Metadata:    &ctrlv1.CommandMetadata{CommandId: NewCommandID("example")},
		WorkspaceId: workspaceID,
	})
	if err == nil {
		log.Fatal("starting an AVAILABLE workspace was accepted")
	}
	code, detail := describe(err)
	if code != codes.FailedPrecondition || detail.GetReason() != ctrlv1.ErrorReason_ERROR_REASON_CONFLICT {
		log.Fatalf("want FailedPrecondition/CONFLICT, got %s/%s", code, detail.GetReason())
	}
	fmt.Printf("conflict: code=%s reason=%s\n", code, detail.GetReason())

	// Stop, settled.
	current, err := client.GetWorkspace(ctx, &ctrlv1.GetWorkspaceRequest{WorkspaceId: workspaceID})
	if err != nil {
		log.Fatal(err)
	}
	request := &ctrlv1.StopWorkspaceRequest{
		Metadata:                   &ctrlv1.CommandMetadata{CommandId: NewCommandID("example")},
		WorkspaceId:                workspaceID,
		ExpectedExpirationRevision: current.GetWorkspace().GetExpiration().GetRevision(),
	}
	stopped, err := Settle(ctx, settleOptions, func(ctx context.Context) (*ctrlv1.StopWorkspaceResponse, error) {
		return client.StopWorkspace(ctx, request)
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("stopped: %s durability=%s\n", stopped.GetWorkspace().GetState(), stopped.GetCommand().GetResult().GetDurability())

	// Start, and wait.
	commandID := NewCommandID("example")
	started, err := client.StartWorkspace(ctx, &ctrlv1.StartWorkspaceRequest{
		Metadata:                   &ctrlv1.CommandMetadata{CommandId: commandID},
		WorkspaceId:                workspaceID,
		ExpectedExpirationRevision: stopped.GetWorkspace().GetExpiration().GetRevision(),
	})
	if err != nil {
		log.Fatal(err)
	}
	workspace, err := WaitWorkspace(ctx, client, started.GetWorkspace(), commandID)
	if err != nil {
		log.Fatal(err)
	}
	if workspace.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		log.Fatalf("started workspace is %s", workspace.GetState())
	}
	fmt.Printf("started: %s\n", workspace.GetState())

	// Delete, settled, and wait until DELETED.
	commandID = NewCommandID("example")
	deleteRequest := &ctrlv1.DeleteWorkspaceRequest{
		Metadata:                   &ctrlv1.CommandMetadata{CommandId: commandID},
		WorkspaceId:                workspaceID,
		ExpectedExpirationRevision: workspace.GetExpiration().GetRevision(),
	}
	if _, err := Settle(ctx, settleOptions, func(ctx context.Context) (*ctrlv1.DeleteWorkspaceResponse, error) {
		return client.DeleteWorkspace(ctx, deleteRequest)
	}); err != nil {
		log.Fatal(err)
	}
	if err := WaitWorkspaceDeleted(ctx, client, workspaceID); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("deleted: %s\n", workspaceID)
	fmt.Println("ok")
}
