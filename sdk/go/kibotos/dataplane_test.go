//go:build dataplane

package kibotos_test

// The data-plane tests (processes_test.go, files_test.go) need a server that runs guests:
// kibo-ctrl serve --runtime process (bubblewrap sandboxes, as root) at $KIBO_SERVER, not the
// simulator the package's other tests use. They build with the `dataplane` tag:
// tests/system/test_go_sdk_data_plane.py starts such a server and runs
// `go test -tags dataplane -run '^TestDataPlane' ./kibotos/`.

import (
	"bytes"
	"context"
	"testing"
	"time"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	"github.com/kibo-dev/kibo/sdk/go/kibotos"
)

// guest creates a small workspace, waits until it is AVAILABLE and returns a credential for
// it; the workspace is deleted (and the deletion waited for) at the end of the test.
func guest(ctx context.Context, t *testing.T, client *kibotos.Client) string {
	t.Helper()
	request := &ctrlv1.CreateWorkspaceRequest{Spec: &ctrlv1.WorkspaceSpec{
		Labels:    map[string]string{"sdk": "go", "test": "data-plane"},
		Resources: &ctrlv1.Resources{Vcpus: 1, MemoryMib: 64},
	}}
	created, err := client.CreateWorkspace(ctx, request)
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetWorkspace().GetWorkspaceId()
	t.Cleanup(func() {
		cleanup, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		deleted, err := client.DeleteWorkspace(cleanup, &ctrlv1.DeleteWorkspaceRequest{WorkspaceId: id})
		if err == nil {
			err = client.WaitWorkspaceDeleted(cleanup, id, deleted.GetCommand().GetCommandId())
		}
		if err != nil {
			t.Errorf("deleting %s: %v", id, err)
		}
	})
	workspace, err := client.WaitWorkspace(ctx, created.GetWorkspace(), request.GetMetadata().GetCommandId())
	if err != nil {
		t.Fatal(err)
	}
	if workspace.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
		t.Fatalf("created workspace is %s", workspace.GetState())
	}
	issued, err := client.IssueDataPlaneCredential(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return issued.GetCredential()
}

// sh runs a shell line in the guest in the foreground and fails the test unless it exits 0;
// it returns the line's standard output.
func sh(ctx context.Context, t *testing.T, client *kibotos.Client, credential, line string) []byte {
	t.Helper()
	result, err := client.Run(ctx, &ctrlv1.StartWorkspaceProcessRequest{Credential: credential, Shell: line})
	if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	if result.ExitCode != 0 {
		t.Fatalf("%s: exit %d: %s", line, result.ExitCode, result.Stderr)
	}
	return result.Stdout
}

// outputUntil reads a process's events until its output contains want, and returns the
// output read; it fails the test at an error, an exit or after 20 s.
func outputUntil(t *testing.T, process *kibotos.Process, want string) []byte {
	t.Helper()
	seen, _ := streamsUntil(t, process, want)
	return seen
}

// streamsUntil is outputUntil, also returning the streams the output came on.
func streamsUntil(t *testing.T, process *kibotos.Process, want string) ([]byte, map[kibotos.OutputStream]bool) {
	t.Helper()
	var seen []byte
	streams := map[kibotos.OutputStream]bool{}
	timer := time.AfterFunc(20*time.Second, func() { _ = process.Close() })
	defer timer.Stop()
	for !bytes.Contains(seen, []byte(want)) {
		event, err := process.Recv()
		if err != nil {
			t.Fatalf("waiting for %q (seen %q): %v", want, seen, err)
		}
		switch e := event.(type) {
		case kibotos.ProcessOutput:
			seen = append(seen, e.Data...)
			streams[e.Stream] = true
		case kibotos.ProcessExit:
			t.Fatalf("waiting for %q (seen %q): the process exited %d", want, seen, e.Code)
		}
	}
	return seen, streams
}

// listed is the process of the workspace's list with this tag (nil when none).
func listed(ctx context.Context, t *testing.T, client *kibotos.Client, credential, tag string) *ctrlv1.WorkspaceProcess {
	t.Helper()
	processes, err := client.ListWorkspaceProcesses(ctx, credential)
	if err != nil {
		t.Fatal(err)
	}
	for _, process := range processes {
		if process.GetTag() == tag {
			return process
		}
	}
	return nil
}

// eventually polls check every 20 ms until it holds, failing the test after 10 s.
func eventually(t *testing.T, what string, check func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !check() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
