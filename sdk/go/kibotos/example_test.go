package kibotos_test

// The Go snippets of the lifecycle page (seed "生命周期": stop, start, delete), compiled and
// run by go test. They are the page's code, adapted only where the transport differs: the page
// uses connect-go (connect.NewRequest(...), response.Msg), this SDK the gRPC stubs (the request
// itself, the response itself). Each example first makes the workspace the snippet starts from.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"time"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	"github.com/kibo-dev/kibo/sdk/go/kibotos"
)

// settleOptions is the page's: resend while the ctrl answers that the command still executes.
var settleOptions = kibotos.SettleOptions{Timeout: time.Minute}

// exampleClient connects to $KIBO_SERVER with the token of $KIBO_TOKEN (or the local
// server's admin token).
func exampleClient() *kibotos.Client {
	client, err := kibotos.New("")
	if err != nil {
		log.Fatal(err)
	}
	return client
}

// exampleWorkspace creates a workspace and waits until it is AVAILABLE.
func exampleWorkspace(ctx context.Context, client *kibotos.Client) *ctrlv1.Workspace {
	request := &ctrlv1.CreateWorkspaceRequest{}
	created, err := client.CreateWorkspace(ctx, request)
	if err != nil {
		log.Fatal(err)
	}
	workspace, err := client.WaitWorkspace(ctx, created.GetWorkspace(), request.GetMetadata().GetCommandId())
	if err != nil {
		log.Fatal(err)
	}
	return workspace
}

// The page's "停止" (stop) snippet: read the workspace, then stop it with Settle.
func ExampleSettle() {
	ctx := context.Background()
	client := exampleClient()
	defer client.Close()
	workspaceID := exampleWorkspace(ctx, client).GetWorkspaceId()

	current, err := client.Workspaces().GetWorkspace(ctx, &ctrlv1.GetWorkspaceRequest{WorkspaceId: workspaceID})
	if err != nil {
		log.Fatal(err)
	}
	request := &ctrlv1.StopWorkspaceRequest{
		Metadata:                   &ctrlv1.CommandMetadata{CommandId: kibotos.NewCommandID("example")},
		WorkspaceId:                workspaceID,
		ExpectedExpirationRevision: current.GetWorkspace().GetExpiration().GetRevision(),
	}
	stopped, err := kibotos.Settle(ctx, settleOptions, func(ctx context.Context) (*ctrlv1.StopWorkspaceResponse, error) {
		return client.Workspaces().StopWorkspace(ctx, request)
	})
	if err != nil {
		log.Fatal(err)
	}

	fmt.Println(stopped.GetWorkspace().GetState(), stopped.GetCommand().GetResult().GetDurability())
	// Output: WORKSPACE_STATE_STOPPED STOP_DURABILITY_CONFIRMED
}

// The page's "启动" (start) snippet: start a stopped workspace, then WaitWorkspace.
func ExampleClient_WaitWorkspace() {
	ctx := context.Background()
	client := exampleClient()
	defer client.Close()
	stopped, err := client.StopWorkspace(ctx, &ctrlv1.StopWorkspaceRequest{WorkspaceId: exampleWorkspace(ctx, client).GetWorkspaceId()})
	if err != nil {
		log.Fatal(err)
	}
	workspaceID := stopped.GetWorkspace().GetWorkspaceId()

	commandID := kibotos.NewCommandID("example")
	started, err := client.Workspaces().StartWorkspace(ctx, &ctrlv1.StartWorkspaceRequest{
		Metadata:                   &ctrlv1.CommandMetadata{CommandId: commandID},
		WorkspaceId:                workspaceID,
		ExpectedExpirationRevision: stopped.GetWorkspace().GetExpiration().GetRevision(),
	})
	if err != nil {
		log.Fatal(err)
	}
	workspace, err := client.WaitWorkspace(ctx, started.GetWorkspace(), commandID)
	if err != nil {
		log.Fatal(err)
	}

	fmt.Println(workspace.GetState())
	// Output: WORKSPACE_STATE_AVAILABLE
}

// The page's "删除" (delete) snippet: delete with Settle, then WaitWorkspaceDeleted.
func ExampleClient_WaitWorkspaceDeleted() {
	ctx := context.Background()
	client := exampleClient()
	defer client.Close()
	workspace := exampleWorkspace(ctx, client)
	workspaceID := workspace.GetWorkspaceId()

	commandID := kibotos.NewCommandID("example")
	request := &ctrlv1.DeleteWorkspaceRequest{
		Metadata:                   &ctrlv1.CommandMetadata{CommandId: commandID},
		WorkspaceId:                workspaceID,
		ExpectedExpirationRevision: workspace.GetExpiration().GetRevision(),
	}
	if _, err := kibotos.Settle(ctx, settleOptions, func(ctx context.Context) (*ctrlv1.DeleteWorkspaceResponse, error) {
		return client.Workspaces().DeleteWorkspace(ctx, request)
	}); err != nil {
		log.Fatal(err)
	}
	if err := client.WaitWorkspaceDeleted(ctx, workspaceID, commandID); err != nil {
		log.Fatal(err)
	}

	deleted, err := client.GetWorkspace(ctx, workspaceID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(deleted.GetState())
	// Output: WORKSPACE_STATE_DELETED
}

// The page's "用 API" note: a refused force stop is failed_precondition with
// ErrorDetail.reason CONFLICT, here a ConflictError.
func ExampleConflictError() {
	ctx := context.Background()
	client := exampleClient()
	defer client.Close()
	stopped, err := client.StopWorkspace(ctx, &ctrlv1.StopWorkspaceRequest{WorkspaceId: exampleWorkspace(ctx, client).GetWorkspaceId()})
	if err != nil {
		log.Fatal(err)
	}

	_, err = client.StopWorkspace(ctx, &ctrlv1.StopWorkspaceRequest{
		WorkspaceId: stopped.GetWorkspace().GetWorkspaceId(),
		Mode:        ctrlv1.StopMode_STOP_MODE_FORCE,
	})
	var conflict kibotos.ConflictError
	if errors.As(err, &conflict) {
		fmt.Println(conflict.Code, conflict.Reason(), conflict.WorkspaceState())
	}
	// Output: FailedPrecondition CONFLICT STOPPED
}

func ExampleNewCommandID() {
	commandID := kibotos.NewCommandID("example")
	fmt.Println(strings.HasPrefix(commandID, "example/"), len(commandID), kibotos.CheckCommandID(commandID) == nil)
	// Output: true 44 true
}
