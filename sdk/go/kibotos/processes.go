package kibotos

import (
	"context"
	"errors"
	"fmt"
	"io"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	"google.golang.org/grpc/codes"
)

// The data plane's processes: started in a workspace's guest and kept by its node, by pid and
// tag, until they exit and after (the last 16 ended, with the tail of their output). They end
// with the workspace's execution (stop, force stop, revoke, delete). StartWorkspaceProcess and
// ConnectWorkspaceProcess give a *Process: its events come from Recv (no goroutine, no
// channel), and it sends input, signals and resizes through unary calls, so the same shapes
// work over every transport kibo serves.

// MaxProcessInput is the most SendWorkspaceProcessInput sends in one call; larger input is
// sent in parts of this size, in order.
const MaxProcessInput = 1 << 20

// Signal is a signal number as the guest (Linux) numbers it. The constants are Linux's: the
// syscall package's differ on other client systems (SIGUSR1 is 30 on macOS, a guest's SIGPWR).
type Signal int32

// The signals people send to a guest's process.
const (
	SignalHup   Signal = 1
	SignalInt   Signal = 2
	SignalQuit  Signal = 3
	SignalKill  Signal = 9
	SignalUsr1  Signal = 10
	SignalUsr2  Signal = 12
	SignalTerm  Signal = 15
	SignalCont  Signal = 18
	SignalStop  Signal = 19
	SignalWinch Signal = 28
)

// ByPID selects a process by its pid in the guest's PID namespace.
func ByPID(pid int32) *ctrlv1.ProcessSelector {
	return &ctrlv1.ProcessSelector{Selector: &ctrlv1.ProcessSelector_Pid{Pid: pid}}
}

// ByTag selects a process by the tag it was started with.
func ByTag(tag string) *ctrlv1.ProcessSelector {
	return &ctrlv1.ProcessSelector{Selector: &ctrlv1.ProcessSelector_Tag{Tag: tag}}
}

// OutputStream says where a process's output came from.
type OutputStream int

// A process's output streams: standard output and error, or its terminal (a PTY is both).
const (
	StreamStdout OutputStream = iota + 1
	StreamStderr
	StreamPTY
)

// String is "stdout", "stderr" or "pty".
func (s OutputStream) String() string {
	switch s {
	case StreamStdout:
		return "stdout"
	case StreamStderr:
		return "stderr"
	case StreamPTY:
		return "pty"
	}
	return fmt.Sprintf("OutputStream(%d)", int(s))
}

// ProcessEvent is one event of a followed process: a ProcessOutput, a ProcessDropped or,
// last, a ProcessExit. Tell them apart with a type switch.
type ProcessEvent interface{ processEvent() }

// ProcessOutput is output of the process, in the order it wrote it.
type ProcessOutput struct {
	Stream OutputStream
	Data   []byte
}

// ProcessDropped says this many bytes of output were not kept for this follower (older than
// the replay, or dropped while it did not read) before the next output.
type ProcessDropped struct{ Bytes int64 }

// ProcessReplayed comes once when following a running process with replay: the output the node
// kept when the call began has all come; what follows comes as the process writes it (an ended
// process's ProcessExit comes instead).
type ProcessReplayed struct{}

// ProcessExit is the last event: how the process ended (128 + N when killed by signal N).
type ProcessExit struct{ Code int32 }

func (ProcessOutput) processEvent()   {}
func (ProcessDropped) processEvent()  {}
func (ProcessReplayed) processEvent() {}
func (ProcessExit) processEvent()     {}

// Process is a process started or followed through the data plane. Recv reads its events;
// SendInput, CloseInput, Signal and Resize act on it; Close leaves the call (a foreground
// process started by this call is killed then, a followed one runs on). A Process is not
// safe for concurrent Recv calls; its other methods may be called from any goroutine.
type Process struct {
	// Pid is the process's pid in the guest (0 when connected by tag).
	Pid int32
	// Tag is the tag it was started with, or connected by ("" when none).
	Tag string

	client     *Client
	credential string
	recv       func() (ProcessEvent, error)
	cancel     context.CancelFunc
	// follows: the stream ends with an exit code (false: a background start's, which ends
	// after `started`).
	follows bool
	err     error
	dropped int64
}

// Selector selects this process: by pid when known, else by tag.
func (p *Process) Selector() *ctrlv1.ProcessSelector {
	if p.Pid != 0 {
		return ByPID(p.Pid)
	}
	return ByTag(p.Tag)
}

// Recv returns the process's next event. After a ProcessExit (and, for a background start,
// at once: its call ends after the start) it returns io.EOF. A stream that ends without an
// exit code is an UnavailableError: ConnectWorkspaceProcess follows the process again. An
// error is returned again by every later call.
func (p *Process) Recv() (ProcessEvent, error) {
	if p.err != nil {
		return nil, p.err
	}
	event, err := p.recv()
	switch {
	case errors.Is(err, io.EOF) && p.follows:
		return nil, p.end(unavailable("the process's stream ended without an exit code: ConnectWorkspaceProcess follows it again"))
	case err != nil:
		return nil, p.end(err)
	}
	switch e := event.(type) {
	case ProcessDropped:
		p.dropped += e.Bytes
	case ProcessExit:
		p.end(io.EOF)
	}
	return event, nil
}

// DroppedBytes is how many bytes of output Recv reported missing so far (ProcessDropped).
func (p *Process) DroppedBytes() int64 { return p.dropped }

// end ends the call; err is what Recv returns from now on.
func (p *Process) end(err error) error {
	p.err = err
	p.cancel()
	return err
}

// ErrBackground is what Wait returns for a process started in the background: its call ended
// at the start; Connect follows it.
var ErrBackground = errors.New("kibotos: the process runs in the background: Connect follows it")

// Wait follows the process to its end, writing its output to stdout and stderr as it comes
// (a terminal's output to stdout; a nil writer discards), and returns its exit code. Output
// that was not kept for this follower is counted in DroppedBytes.
func (p *Process) Wait(stdout, stderr io.Writer) (int32, error) {
	for {
		event, err := p.Recv()
		if errors.Is(err, io.EOF) {
			return 0, ErrBackground
		}
		if err != nil {
			return 0, err
		}
		switch e := event.(type) {
		case ProcessOutput:
			w := stdout
			if e.Stream == StreamStderr {
				w = stderr
			}
			if w != nil {
				if _, err := w.Write(e.Data); err != nil {
					return 0, p.end(err)
				}
			}
		case ProcessExit:
			return e.Code, nil
		}
	}
}

// Close leaves the call: a foreground process it started is killed (that is the contract of
// a foreground start), a followed or background one runs on. Idempotent, and safe to call
// while another goroutine is in Recv (which then returns the cancellation).
func (p *Process) Close() error {
	p.cancel()
	return nil
}

// SendInput writes data to the process's standard input (its terminal's with a PTY: "\x03"
// is Ctrl-C), waiting while the process does not read.
func (p *Process) SendInput(ctx context.Context, data []byte) error {
	return p.client.SendWorkspaceProcessInput(ctx, &ctrlv1.SendWorkspaceProcessInputRequest{Credential: p.credential, Process: p.Selector(), Data: data})
}

// CloseInput closes the process's standard input (no effect on a terminal: send "\x04").
func (p *Process) CloseInput(ctx context.Context) error {
	return p.client.SendWorkspaceProcessInput(ctx, &ctrlv1.SendWorkspaceProcessInputRequest{Credential: p.credential, Process: p.Selector(), CloseStdin: true})
}

// Signal sends the process a signal (0: SignalTerm).
func (p *Process) Signal(ctx context.Context, signal Signal) error {
	return p.client.SignalWorkspaceProcess(ctx, p.credential, p.Selector(), signal)
}

// Resize resizes the process's terminal (ConflictError for one without a PTY).
func (p *Process) Resize(ctx context.Context, rows, cols uint32) error {
	return p.client.ResizeWorkspaceProcess(ctx, p.credential, p.Selector(), rows, cols)
}

// Connect follows the process again (see ConnectWorkspaceProcess); this handle is left as it is.
func (p *Process) Connect(ctx context.Context, replay bool) (*Process, error) {
	connected, err := p.client.ConnectWorkspaceProcess(ctx, p.credential, p.Selector(), replay)
	if err != nil {
		return nil, err
	}
	connected.Pid, connected.Tag = p.Pid, p.Tag
	return connected, nil
}

// startEvent types a StartWorkspaceProcess message (not its `started`).
func startEvent(m *ctrlv1.StartWorkspaceProcessResponse) ProcessEvent {
	switch e := m.GetEvent().(type) {
	case *ctrlv1.StartWorkspaceProcessResponse_Stdout:
		return ProcessOutput{StreamStdout, e.Stdout}
	case *ctrlv1.StartWorkspaceProcessResponse_Stderr:
		return ProcessOutput{StreamStderr, e.Stderr}
	case *ctrlv1.StartWorkspaceProcessResponse_Pty:
		return ProcessOutput{StreamPTY, e.Pty}
	case *ctrlv1.StartWorkspaceProcessResponse_DroppedBytes:
		return ProcessDropped{e.DroppedBytes}
	case *ctrlv1.StartWorkspaceProcessResponse_ExitCode:
		return ProcessExit{e.ExitCode}
	}
	return nil
}

// connectEvent types a ConnectWorkspaceProcess message.
func connectEvent(m *ctrlv1.ConnectWorkspaceProcessResponse) ProcessEvent {
	switch e := m.GetEvent().(type) {
	case *ctrlv1.ConnectWorkspaceProcessResponse_Stdout:
		return ProcessOutput{StreamStdout, e.Stdout}
	case *ctrlv1.ConnectWorkspaceProcessResponse_Stderr:
		return ProcessOutput{StreamStderr, e.Stderr}
	case *ctrlv1.ConnectWorkspaceProcessResponse_Pty:
		return ProcessOutput{StreamPTY, e.Pty}
	case *ctrlv1.ConnectWorkspaceProcessResponse_DroppedBytes:
		return ProcessDropped{e.DroppedBytes}
	case *ctrlv1.ConnectWorkspaceProcessResponse_Replayed:
		return ProcessReplayed{}
	case *ctrlv1.ConnectWorkspaceProcessResponse_ExitCode:
		return ProcessExit{e.ExitCode}
	}
	return nil
}

// skipUnknown skips the messages this SDK does not know (events a newer server added), so an
// added event never breaks an older client.
func skipUnknown(next func() (ProcessEvent, error)) func() (ProcessEvent, error) {
	return func() (ProcessEvent, error) {
		for {
			event, err := next()
			if err != nil || event != nil {
				return event, err
			}
		}
	}
}

// StartWorkspaceProcess starts request's command (Argv, or Shell: a line for /bin/sh -c) and
// returns once it started, with its Pid and Tag. In the foreground its events follow on
// Recv (Close or ctx's end kills it); in the background (request.Background) it runs on
// after this call: Recv gives io.EOF and Connect follows it. Never retried: a failed call
// may have started the process.
func (c *Client) StartWorkspaceProcess(ctx context.Context, request *ctrlv1.StartWorkspaceProcessRequest) (*Process, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.dataPlane.StartWorkspaceProcess(ctx, request)
	if err != nil {
		cancel()
		return nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		cancel()
		if errors.Is(err, io.EOF) {
			err = unavailable("the process's stream ended before it started")
		}
		return nil, err
	}
	started := first.GetStarted()
	if started == nil {
		cancel()
		return nil, InternalError{localError(codes.Internal, ctrlv1.ErrorReason_ERROR_REASON_UNSPECIFIED, "the process's stream did not begin with `started`", "")}
	}
	next := func() (ProcessEvent, error) {
		message, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		return startEvent(message), nil
	}
	return &Process{
		Pid: started.GetPid(), Tag: started.GetTag(), client: c, credential: request.GetCredential(),
		recv: skipUnknown(next), cancel: cancel, follows: !request.GetBackground(),
	}, nil
}

// ConnectWorkspaceProcess follows a process (ByPID or ByTag): with replay its kept output first
// (the last 128 KiB), then its output as it comes, then its ProcessExit (at once for one that
// has exited). Errors of the call (NotFoundError: no such process) come from the first Recv.
// Close leaves the process running.
func (c *Client) ConnectWorkspaceProcess(ctx context.Context, credential string, process *ctrlv1.ProcessSelector, replay bool) (*Process, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.dataPlane.ConnectWorkspaceProcess(ctx, &ctrlv1.ConnectWorkspaceProcessRequest{Credential: credential, Process: process, Replay: replay})
	if err != nil {
		cancel()
		return nil, err
	}
	next := func() (ProcessEvent, error) {
		message, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		return connectEvent(message), nil
	}
	return &Process{
		Pid: process.GetPid(), Tag: process.GetTag(), client: c, credential: credential,
		recv: skipUnknown(next), cancel: cancel, follows: true,
	}, nil
}

// ListWorkspaceProcesses returns the processes started through the data plane in this
// execution, running and ended (uploads are not listed).
func (c *Client) ListWorkspaceProcesses(ctx context.Context, credential string) ([]*ctrlv1.WorkspaceProcess, error) {
	reply, err := c.dataPlane.ListWorkspaceProcesses(ctx, &ctrlv1.ListWorkspaceProcessesRequest{Credential: credential})
	return reply.GetProcesses(), err
}

// SendWorkspaceProcessInput writes request.Data to a process's standard input, then closes
// it when request.CloseStdin. Data larger than MaxProcessInput goes in parts of that size, in
// order (CloseStdin with the last); each waits while the process does not read.
func (c *Client) SendWorkspaceProcessInput(ctx context.Context, request *ctrlv1.SendWorkspaceProcessInputRequest) error {
	data := request.GetData()
	for {
		part := data
		if len(part) > MaxProcessInput {
			part = part[:MaxProcessInput]
		}
		data = data[len(part):]
		last := len(data) == 0
		_, err := c.dataPlane.SendWorkspaceProcessInput(ctx, &ctrlv1.SendWorkspaceProcessInputRequest{
			Credential: request.GetCredential(), Process: request.GetProcess(), Data: part, CloseStdin: last && request.GetCloseStdin(),
		})
		if err != nil || last {
			return err
		}
	}
}

// SignalWorkspaceProcess sends a process a signal (0: SignalTerm).
func (c *Client) SignalWorkspaceProcess(ctx context.Context, credential string, process *ctrlv1.ProcessSelector, signal Signal) error {
	_, err := c.dataPlane.SignalWorkspaceProcess(ctx, &ctrlv1.SignalWorkspaceProcessRequest{Credential: credential, Process: process, Signal: int32(signal)})
	return err
}

// ResizeWorkspaceProcess resizes a process's terminal (it gets SIGWINCH); ConflictError for
// a process without a PTY.
func (c *Client) ResizeWorkspaceProcess(ctx context.Context, credential string, process *ctrlv1.ProcessSelector, rows, cols uint32) error {
	_, err := c.dataPlane.ResizeWorkspaceProcess(ctx, &ctrlv1.ResizeWorkspaceProcessRequest{Credential: credential, Process: process, Size: &ctrlv1.PtySize{Rows: rows, Cols: cols}})
	return err
}

// ProcessResult is how a process run by Run ended and its output (a terminal's in Stdout).
type ProcessResult struct {
	ExitCode int32
	Stdout   []byte
	Stderr   []byte
	// DroppedBytes: output not kept for this caller (none for a foreground run, whose output
	// the guest waits for).
	DroppedBytes int64
}

// Run runs request's command in the foreground and collects its exit code and output (all of
// it in memory: for large output, StartWorkspaceProcess and Wait with writers). Never retried.
func (c *Client) Run(ctx context.Context, request *ctrlv1.StartWorkspaceProcessRequest) (ProcessResult, error) {
	var result ProcessResult
	if request.GetBackground() {
		return result, InvalidArgumentError{localError(codes.InvalidArgument, ctrlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT,
			"Run runs in the foreground: StartWorkspaceProcess starts a background process", "background")}
	}
	process, err := c.StartWorkspaceProcess(ctx, request)
	if err != nil {
		return result, err
	}
	defer process.Close()
	var stdout, stderr byteSink
	result.ExitCode, err = process.Wait(&stdout, &stderr)
	result.Stdout, result.Stderr, result.DroppedBytes = stdout, stderr, process.DroppedBytes()
	return result, err
}

// byteSink collects what is written to it.
type byteSink []byte

func (s *byteSink) Write(p []byte) (int, error) {
	*s = append(*s, p...)
	return len(p), nil
}
