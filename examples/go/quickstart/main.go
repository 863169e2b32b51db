// Command quickstart drives a kibo workspace through its lifecycle with the Go SDK
// (github.com/kibo-dev/kibo/sdk/go/kibotos), like the Go snippets of the lifecycle docs: stop
// it with settling, start it and wait, delete it and wait until DELETED. Before that it shows
// how a rejection reads: starting an AVAILABLE workspace is FAILED_PRECONDITION, which the
// SDK types as a kibotos.ConflictError carrying the kibo.ctrl.v1.ErrorDetail (reason
// CONFLICT) and the google.rpc.ErrorInfo of the status details.
//
// Build it with ../build.sh (offline, GOPATH mode, Debian's Go packages), then:
//
//	quickstart -addr 127.0.0.1:50051 -token "$(cat ~/.local/share/kibo/admin.token)"
//
// The token (default: $KIBO_TOKEN, else the local server's admin token, the SDK's token
// discovery) is sent as `authorization: Bearer TOKEN` on every call.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	"github.com/kibo-dev/kibo/sdk/go/kibotos"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "kibo-ctrl gRPC address")
	token := flag.String("token", os.Getenv("KIBO_TOKEN"), "bearer token (default $KIBO_TOKEN)")
	timeout := flag.Duration("timeout", 60*time.Second, "deadline for the whole run")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	client, err := kibotos.New(*addr, kibotos.WithToken(*token))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	// Resend while the ctrl answers that the command still executes; show each answer.
	settleOptions := kibotos.SettleOptions{
		Timeout: 30 * time.Second,
		OnAnswer: func(answer kibotos.CommandResponse) {
			command := answer.GetCommand()
			if !kibotos.IsTerminal(command) {
				fmt.Printf("command %s is %s: resending\n", command.GetCommandId(), command.GetState())
			}
		},
	}

	// A workspace to work with.
	createID := kibotos.NewCommandID("example")
	createRequest := &ctrlv1.CreateWorkspaceRequest{
		Metadata: &ctrlv1.CommandMetadata{CommandId: createID},
		Spec:     &ctrlv1.WorkspaceSpec{Labels: map[string]string{"example": "go"}},
	}
	created, err := kibotos.Settle(ctx, settleOptions, func(ctx context.Context) (*ctrlv1.CreateWorkspaceResponse, error) {
		return client.Workspaces().CreateWorkspace(ctx, createRequest)
	})
	if err != nil {
		log.Fatal(err)
	}
	workspaceID := created.GetWorkspace().GetWorkspaceId()
	if _, err := client.WaitWorkspace(ctx, created.GetWorkspace(), createID); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("created %s\n", workspaceID)

	// Starting an AVAILABLE workspace is rejected: FAILED_PRECONDITION, reason CONFLICT.
	_, err = client.Workspaces().StartWorkspace(ctx, &ctrlv1.StartWorkspaceRequest{
		Metadata:    &ctrlv1.CommandMetadata{CommandId: kibotos.NewCommandID("example")},
		WorkspaceId: workspaceID,
	})
	var conflict kibotos.ConflictError
	if !errors.As(err, &conflict) {
		log.Fatalf("want a ConflictError, got %v", err)
	}
	fmt.Printf("error detail: reason=%s workspace_state=%s hint=%q\n", conflict.Detail.GetReason(), conflict.WorkspaceState(), conflict.Hint())
	fmt.Printf("error info: reason=%s domain=%s\n", conflict.Info.GetReason(), conflict.Info.GetDomain())
	fmt.Printf("conflict: code=%s reason=%s\n", conflict.Code, conflict.Detail.GetReason())

	// Stop, settled.
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
	fmt.Printf("stopped: %s durability=%s\n", stopped.GetWorkspace().GetState(), stopped.GetCommand().GetResult().GetDurability())

	// Start, and wait.
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
	if workspace.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		log.Fatalf("started workspace is %s", workspace.GetState())
	}
	fmt.Printf("started: %s\n", workspace.GetState())

	// Delete, settled, and wait until DELETED.
	commandID = kibotos.NewCommandID("example")
	deleteRequest := &ctrlv1.DeleteWorkspaceRequest{
		Metadata:                   &ctrlv1.CommandMetadata{CommandId: commandID},
		WorkspaceId:                workspaceID,
		ExpectedExpirationRevision: workspace.GetExpiration().GetRevision(),
	}
	if _, err := kibotos.Settle(ctx, settleOptions, func(ctx context.Context) (*ctrlv1.DeleteWorkspaceResponse, error) {
		return client.Workspaces().DeleteWorkspace(ctx, deleteRequest)
	}); err != nil {
		log.Fatal(err)
	}
	if err := client.WaitWorkspaceDeleted(ctx, workspaceID, commandID); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("deleted: %s\n", workspaceID)
	fmt.Println("ok")
}
