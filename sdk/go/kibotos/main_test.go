package kibotos_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	"github.com/kibo-dev/kibo/sdk/go/kibotos"
)

// The tests and examples talk to a real server: kibo-ctrl serve --runtime sim at
// $KIBO_SERVER, its token in $KIBO_TOKEN. tests/system/test_go_sdk.py starts one and runs go test.
func TestMain(m *testing.M) {
	if os.Getenv(kibotos.EnvServer) == "" {
		fmt.Fprintln(os.Stderr, "set KIBO_SERVER (and KIBO_TOKEN) to a `kibo-ctrl serve --runtime sim`, "+
			"or run `pytest tests/system/test_go_sdk.py`, which starts one")
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// connect returns a client of the test server, closed at the end of the test.
func connect(t *testing.T, options ...kibotos.Option) *kibotos.Client {
	t.Helper()
	client, err := kibotos.New("", options...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// available creates a workspace and waits until it is AVAILABLE.
func available(ctx context.Context, t *testing.T, client *kibotos.Client) *ctrlv1.Workspace {
	t.Helper()
	request := &ctrlv1.CreateWorkspaceRequest{Spec: &ctrlv1.WorkspaceSpec{Labels: map[string]string{"sdk": "go"}}}
	created, err := client.CreateWorkspace(ctx, request)
	if err != nil {
		t.Fatal(err)
	}
	workspace, err := client.WaitWorkspace(ctx, created.GetWorkspace(), request.GetMetadata().GetCommandId())
	if err != nil {
		t.Fatal(err)
	}
	if workspace.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Fatalf("created workspace is %s", workspace.GetState())
	}
	return workspace
}
