//go:build dataplane

package kibotos_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	"github.com/kibo-dev/kibo/sdk/go/kibotos"
)

// Foreground: Run collects stdout, stderr and the exit code; stdin given up front and closed;
// a shell line; the environment and working directory; Run refuses a background request.
func TestDataPlaneRun(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	credential := guest(ctx, t, client)

	result, err := client.Run(ctx, &ctrlv1.StartWorkspaceProcessRequest{Credential: credential, Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	if result.ExitCode != 3 || string(result.Stdout) != "out\n" || string(result.Stderr) != "err\n" || result.DroppedBytes != 0 {
		t.Fatalf("run: %+v", result)
	}
	result, err = client.Run(ctx, &ctrlv1.StartWorkspaceProcessRequest{
		Credential: credential, Argv: []string{"cat"}, Stdin: []byte("given up front"), CloseStdin: true,
	})
	if err != nil || result.ExitCode != 0 || string(result.Stdout) != "given up front" {
		t.Fatalf("cat: %+v %v", result, err)
	}
	result, err = client.Run(ctx, &ctrlv1.StartWorkspaceProcessRequest{
		Credential: credential, Shell: `echo "$GREETING $((6 * 7))"; pwd`, Env: map[string]string{"GREETING": "hi"}, WorkingDir: "/tmp",
	})
	if err != nil || string(result.Stdout) != "hi 42\n/tmp\n" {
		t.Fatalf("shell line: %+v %v", result, err)
	}
	// A user of the guest by name: the process runs with its uid.
	if out := sh(ctx, t, client, credential, "id -u nobody"); len(out) == 0 {
		t.Fatal("no uid for nobody")
	} else if result, err = client.Run(ctx, &ctrlv1.StartWorkspaceProcessRequest{Credential: credential, Argv: []string{"id", "-u"}, User: "nobody"}); err != nil || !bytes.Equal(result.Stdout, out) {
		t.Fatalf("as nobody: %+v %v (want uid %q)", result, err, out)
	}
	_, err = client.Run(ctx, &ctrlv1.StartWorkspaceProcessRequest{Credential: credential, Argv: []string{"true"}, Background: true})
	var invalid kibotos.InvalidArgumentError
	if !errors.As(err, &invalid) || invalid.Field() != "background" {
		t.Fatalf("Run of a background request: want InvalidArgumentError on background, got %v", err)
	}
	// The server's own validation comes typed: argv and shell together.
	_, err = client.Run(ctx, &ctrlv1.StartWorkspaceProcessRequest{Credential: credential, Argv: []string{"true"}, Shell: "true"})
	if !errors.As(err, &kibotos.InvalidArgumentError{}) {
		t.Fatalf("argv and shell: want InvalidArgumentError, got %v", err)
	}
}

// Background by tag: the start returns at once; the process is listed; the client leaves and
// comes back with the replay of its output; input reaches it; a signal ends it with 128 + N,
// seen by the follower and in the list.
func TestDataPlaneBackgroundProcessByTag(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	credential := guest(ctx, t, client)

	started, err := client.StartWorkspaceProcess(ctx, &ctrlv1.StartWorkspaceProcessRequest{
		Credential: credential, Tag: "echoer", Background: true,
		Shell: `echo ready; while read line; do echo "got $line"; done`,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer started.Close()
	if started.Pid <= 0 || started.Tag != "echoer" {
		t.Fatalf("started: pid %d tag %q", started.Pid, started.Tag)
	}
	if _, err := started.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("a background start's stream ends after the start: got %v", err)
	}
	if _, err := started.Wait(nil, nil); !errors.Is(err, kibotos.ErrBackground) {
		t.Fatalf("Wait of a background start: got %v", err)
	}
	// The tag is taken while it runs.
	_, err = client.StartWorkspaceProcess(ctx, &ctrlv1.StartWorkspaceProcessRequest{Credential: credential, Tag: "echoer", Background: true, Argv: []string{"true"}})
	if !errors.As(err, &kibotos.ConflictError{}) {
		t.Fatalf("a second process tagged echoer: want ConflictError, got %v", err)
	}

	first, err := client.ConnectWorkspaceProcess(ctx, credential, kibotos.ByTag("echoer"), true)
	if err != nil {
		t.Fatal(err)
	}
	outputUntil(t, first, "ready\n") // the replay: it was written before this call
	if event, err := first.Recv(); err != nil || event != (kibotos.ProcessReplayed{}) {
		t.Fatalf("after the kept output: want ProcessReplayed, got %#v, %v", event, err)
	}
	if err := first.SendInput(ctx, []byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	outputUntil(t, first, "got ping\n")
	_ = first.Close() // leaves it running

	process := listed(ctx, t, client, credential, "echoer")
	if process == nil || !process.GetRunning() || process.GetPid() != started.Pid || process.GetStartTime() == nil {
		t.Fatalf("listed after the client left: %v", process)
	}
	// By pid this time, through the first handle; the replay has all of its output.
	again, err := started.Connect(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if seen := outputUntil(t, again, "got ping\n"); !strings.HasPrefix(string(seen), "ready\ngot ping\n") {
		t.Fatalf("replay: %q", seen)
	}
	if err := again.SendInput(ctx, []byte("pong\n")); err != nil {
		t.Fatal(err)
	}
	outputUntil(t, again, "got pong\n")
	if err := again.Resize(ctx, 30, 100); !errors.As(err, &kibotos.ConflictError{}) {
		t.Fatalf("resizing a process without a PTY: want ConflictError, got %v", err)
	}
	if err := again.Signal(ctx, kibotos.SignalUsr1); err != nil {
		t.Fatal(err)
	}
	code, err := again.Wait(nil, nil)
	if err != nil || code != 128+10 {
		t.Fatalf("after SIGUSR1 (10 in the guest): exit %d, %v", code, err)
	}
	if _, err := again.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the exit: %v", err)
	}
	process = listed(ctx, t, client, credential, "echoer")
	if process == nil || process.GetRunning() || process.GetExitCode() != 138 {
		t.Fatalf("listed after the signal: %v", process)
	}
	// An ended process is still followed: its output, then its exit code at once.
	ended, err := client.ConnectWorkspaceProcess(ctx, credential, kibotos.ByTag("echoer"), true)
	if err != nil {
		t.Fatal(err)
	}
	var replay bytes.Buffer
	if code, err := ended.Wait(&replay, nil); err != nil || code != 138 || replay.String() != "ready\ngot ping\ngot pong\n" {
		t.Fatalf("following the ended process: exit %d %v, output %q", code, err, replay.String())
	}

	// Closing the input ends a reader; no such process is a NotFoundError on the first Recv.
	cat, err := client.StartWorkspaceProcess(ctx, &ctrlv1.StartWorkspaceProcessRequest{Credential: credential, Tag: "cat", Background: true, Argv: []string{"cat"}})
	if err != nil {
		t.Fatal(err)
	}
	follower, err := cat.Connect(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.SendInput(ctx, []byte("meow")); err != nil {
		t.Fatal(err)
	}
	if err := cat.CloseInput(ctx); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code, err := follower.Wait(&out, nil); err != nil || code != 0 || out.String() != "meow" {
		t.Fatalf("cat after its input closed: exit %d %v, output %q", code, err, out.String())
	}
	missing, err := client.ConnectWorkspaceProcess(ctx, credential, kibotos.ByTag("no-such-process"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer missing.Close()
	if _, err := missing.Recv(); !errors.As(err, &kibotos.NotFoundError{}) {
		t.Fatalf("connecting to no such process: want NotFoundError, got %v", err)
	}
	if err := client.SignalWorkspaceProcess(ctx, credential, kibotos.ByPID(999999), kibotos.SignalTerm); !errors.As(err, &kibotos.NotFoundError{}) {
		t.Fatalf("signalling no such process: want NotFoundError, got %v", err)
	}
}

// A terminal: its output comes as pty, `stty size` follows a resize, Ctrl-C written to it
// interrupts the foreground process (exit 130), and input larger than one call's 1 MiB goes
// in parts.
func TestDataPlanePTY(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	credential := guest(ctx, t, client)

	process, err := client.StartWorkspaceProcess(ctx, &ctrlv1.StartWorkspaceProcessRequest{
		Credential: credential, Pty: &ctrlv1.PtySize{Rows: 24, Cols: 80}, Tag: "tty",
		// `exec`: a shell that gets SIGINT while it waits for a command whose own exit is normal
		// goes on (and dies of it only after the next one), so Ctrl-C goes to sleep itself.
		Shell: `stty size; read x; stty size; echo sleeping; exec sleep 30`,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer process.Close()
	if _, streams := streamsUntil(t, process, "24 80"); len(streams) != 1 || !streams[kibotos.StreamPTY] {
		t.Fatalf("a terminal's output comes as pty only: %v", streams)
	}
	if err := process.Resize(ctx, 30, 100); err != nil {
		t.Fatal(err)
	}
	if err := process.SendInput(ctx, []byte("\n")); err != nil {
		t.Fatal(err)
	}
	if seen := outputUntil(t, process, "sleeping"); !bytes.Contains(seen, []byte("30 100")) {
		t.Fatalf("stty size after the resize: %q", seen)
	}
	if err := process.SendInput(ctx, []byte("\x03")); err != nil {
		t.Fatal(err)
	}
	if code, err := process.Wait(nil, nil); err != nil || code != 128+2 {
		t.Fatalf("after Ctrl-C: exit %d, %v", code, err)
	}

	// 3 MiB + 1 through SendWorkspaceProcessInput (4 calls), counted by the guest.
	counter, err := client.StartWorkspaceProcess(ctx, &ctrlv1.StartWorkspaceProcessRequest{Credential: credential, Argv: []string{"wc", "-c"}})
	if err != nil {
		t.Fatal(err)
	}
	defer counter.Close()
	input := bytes.Repeat([]byte("x"), 3<<20+1)
	if err := client.SendWorkspaceProcessInput(ctx, &ctrlv1.SendWorkspaceProcessInputRequest{Credential: credential, Process: counter.Selector(), Data: input, CloseStdin: true}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code, err := counter.Wait(&out, nil); err != nil || code != 0 || strings.TrimSpace(out.String()) != "3145729" {
		t.Fatalf("wc -c of 3 MiB + 1: exit %d %v, output %q", code, err, out.String())
	}
}

// Leaving a foreground start kills its process (the contract of the foreground); an exit by
// SIGKILL is 137.
func TestDataPlaneForegroundCloseKills(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	credential := guest(ctx, t, client)

	process, err := client.StartWorkspaceProcess(ctx, &ctrlv1.StartWorkspaceProcessRequest{Credential: credential, Tag: "sleeper", Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	if p := listed(ctx, t, client, credential, "sleeper"); p == nil || !p.GetRunning() || strings.Join(p.GetArgv(), " ") != "sleep 30" {
		t.Fatalf("listed: %v", p)
	}
	_ = process.Close()
	eventually(t, "the foreground process ended with its call", func() bool {
		p := listed(ctx, t, client, credential, "sleeper")
		return p != nil && !p.GetRunning()
	})

	killed, err := client.StartWorkspaceProcess(ctx, &ctrlv1.StartWorkspaceProcessRequest{Credential: credential, Tag: "killed", Background: true, Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.SignalWorkspaceProcess(ctx, credential, kibotos.ByTag("killed"), kibotos.SignalKill); err != nil {
		t.Fatal(err)
	}
	follower, err := killed.Connect(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if code, err := follower.Wait(nil, nil); err != nil || code != 137 {
		t.Fatalf("after SIGKILL: exit %d, %v", code, err)
	}
}
