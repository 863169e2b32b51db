package kibotos

import (
	"context"
	"errors"
	"io"
	"time"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// WaitOptions says how a wait follows the workspace. The zero value is usable: zero fields
// take the defaults named beside them. The overall deadline is the context's.
type WaitOptions struct {
	// Poll instead of following WatchWorkspace (servers without the stream are polled anyway).
	Poll bool
	// PollInterval is the first pause between polls and reconnects (default 100 ms), growing
	// to MaxPollInterval (default 3 s).
	PollInterval    time.Duration
	MaxPollInterval time.Duration
	// StreamTimeout bounds one watch call (default 30 s), so that a silent stream is
	// re-checked now and then.
	StreamTimeout time.Duration
	// OnUpdate, when set, sees every new snapshot (for progress display).
	OnUpdate func(*ctrlv1.Workspace)
}

func (o WaitOptions) withDefaults() WaitOptions {
	if o.PollInterval == 0 {
		o.PollInterval = 100 * time.Millisecond
	}
	if o.MaxPollInterval == 0 {
		o.MaxPollInterval = 3 * time.Second
	}
	if o.StreamTimeout == 0 {
		o.StreamTimeout = 30 * time.Second
	}
	return o
}

// WaitResult is where a wait ended: the workspace, and the command waited for (terminal; nil
// when waiting for a steady state only).
type WaitResult struct {
	Workspace *ctrlv1.Workspace
	Command   *ctrlv1.WorkspaceCommand
}

// WaitWorkspace follows the workspace until commandID (if not empty) is terminal and the
// workspace steady (AVAILABLE, STOPPED, FAILED or DELETED), and returns it. A command that
// ended FAILED is a CommandFailedError; the context ending first is a WaitTimeoutError
// (nothing is cancelled).
func (c *Client) WaitWorkspace(ctx context.Context, workspace *ctrlv1.Workspace, commandID string) (*ctrlv1.Workspace, error) {
	result, err := c.Wait(ctx, workspace.GetWorkspaceId(), commandID, false, c.waitOptions)
	return result.Workspace, err
}

// WaitWorkspaceDeleted waits until the delete commandID is terminal and the workspace
// DELETED (commandID may be empty: then DELETED alone ends the wait).
func (c *Client) WaitWorkspaceDeleted(ctx context.Context, workspaceID, commandID string) error {
	_, err := c.Wait(ctx, workspaceID, commandID, true, c.waitOptions)
	return err
}

// Wait is WaitWorkspace and WaitWorkspaceDeleted with the options given: it follows
// WatchWorkspace and, when the stream breaks (server restart, network), reads the workspace
// once with GetWorkspace and reconnects with backoff. deleted asks for DELETED.
func (c *Client) Wait(ctx context.Context, workspaceID, commandID string, deleted bool, options WaitOptions) (WaitResult, error) {
	w := &waiter{client: c, workspaceID: workspaceID, commandID: commandID, deleted: deleted, options: options.withDefaults()}
	w.backoff = NewBackoff(w.options.PollInterval, w.options.MaxPollInterval, 2, 0.1)
	w.watch = !w.options.Poll
	w.reconnectNow = true
	for {
		if w.watch {
			done, err := w.watchOnce(ctx)
			if done || (err != nil && !w.outlast(ctx, err)) {
				return w.result(), w.final(ctx, err)
			}
		}
		workspace, err := c.workspaces.GetWorkspace(ctx, &ctrlv1.GetWorkspaceRequest{WorkspaceId: workspaceID})
		if err == nil {
			done, err := w.done(ctx, workspace.GetWorkspace())
			if done || err != nil && !w.outlast(ctx, err) {
				return w.result(), w.final(ctx, err)
			}
		} else if !w.outlast(ctx, err) {
			return w.result(), w.final(ctx, err)
		}
		if err := sleep(ctx, w.pause()); err != nil {
			return w.result(), w.timeout(err)
		}
	}
}

// waiter holds the decisions of one wait (the Python SDK's _Waiter).
type waiter struct {
	client      *Client
	workspaceID string
	commandID   string
	deleted     bool
	options     WaitOptions
	backoff     *Backoff
	watch       bool
	last        *ctrlv1.Workspace
	command     *ctrlv1.WorkspaceCommand
	// The workspace looked done but the command still executed: re-check soon.
	commandPending bool
	// False after an error or a stream that ended on its own: back off before the next round.
	reconnectNow bool
	// Set by a RATE_LIMITED answer: wait at least this long before the next call.
	retryDelay time.Duration
}

// watchOnce follows one bounded WatchWorkspace call; true when the wait is over.
func (w *waiter) watchOnce(ctx context.Context) (bool, error) {
	limit := w.options.StreamTimeout
	if w.commandPending {
		limit = 4 * w.options.PollInterval
	}
	streamCtx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	stream, err := w.client.workspaces.WatchWorkspace(streamCtx, &ctrlv1.WatchWorkspaceRequest{WorkspaceId: w.workspaceID})
	if err != nil {
		return false, w.streamError(ctx, streamCtx, err)
	}
	for {
		message, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			w.reconnectNow = false // ended on its own: re-check, reconnect after a pause
			return false, nil
		}
		if err != nil {
			return false, w.streamError(ctx, streamCtx, err)
		}
		done, err := w.done(ctx, message.GetWorkspace())
		if done || err != nil {
			return done, err
		}
		w.backoff.Reset(w.options.PollInterval)
	}
}

// streamError: the bounded call simply ran its time (nil: re-check, then reconnect at once),
// or a real error.
func (w *waiter) streamError(ctx, streamCtx context.Context, err error) error {
	if ctx.Err() == nil && streamCtx.Err() != nil {
		return nil
	}
	return err
}

// done records a snapshot and tells whether the wait is over (the command is read when the
// workspace side is).
func (w *waiter) done(ctx context.Context, workspace *ctrlv1.Workspace) (bool, error) {
	if w.options.OnUpdate != nil && (w.last == nil || !proto.Equal(w.last, workspace)) {
		w.options.OnUpdate(workspace)
	}
	w.last = workspace
	if w.deleted && w.commandID == "" {
		return workspace.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED, nil
	}
	if !IsSteady(workspace) {
		return false, nil
	}
	if w.commandID == "" {
		return true, nil
	}
	reply, err := w.client.workspaces.GetWorkspaceCommand(ctx, &ctrlv1.GetWorkspaceCommandRequest{CommandId: w.commandID})
	if err != nil {
		return false, err
	}
	w.command = reply.GetCommand()
	if !IsTerminal(w.command) {
		w.commandPending = true
		return false, nil
	}
	w.commandPending = false
	if w.command.GetState() == ctrlv1.CommandState_COMMAND_STATE_FAILED {
		return false, CommandFailedError{Command: w.command, Workspace: w.last}
	}
	return !w.deleted || w.last.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED, nil
}

// outlast reports whether the wait goes on after err: transport trouble and rate limits are
// outlasted, UNIMPLEMENTED turns the watch into polling, the rest ends the wait.
func (w *waiter) outlast(ctx context.Context, err error) bool {
	var failed CommandFailedError
	if ctx.Err() != nil || errors.As(err, &failed) {
		return false
	}
	w.reconnectNow = false
	var limited RateLimitedError
	switch {
	case errors.As(err, &limited):
		w.retryDelay = limited.RetryDelay
		return true
	case status.Code(err) == codes.Unimplemented:
		w.watch = false
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return true // a stream cut short by a server going away, or the network
	}
	return false
}

// pause is how long to sleep before the next round: none after a bounded watch call simply
// ran its time, unless the command still executes (then poll with backoff).
func (w *waiter) pause() time.Duration {
	now := w.reconnectNow && w.watch && !w.commandPending
	w.reconnectNow = true
	if now {
		return 0
	}
	delay := w.backoff.Next()
	if w.retryDelay > delay {
		delay = w.retryDelay
	}
	w.retryDelay = 0
	return delay
}

func (w *waiter) final(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return w.timeout(ctx.Err())
	}
	return err
}

func (w *waiter) timeout(cause error) error {
	return WaitTimeoutError{WorkspaceID: w.workspaceID, CommandID: w.commandID, Workspace: w.last, Command: w.command, Cause: cause}
}

func (w *waiter) result() WaitResult { return WaitResult{Workspace: w.last, Command: w.command} }
