package kibotos

import (
	"context"
	"errors"
	"math/rand"
	"time"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
)

// CommandResponse is what every command RPC answers: the workspace and the command.
type CommandResponse interface {
	GetWorkspace() *ctrlv1.Workspace
	GetCommand() *ctrlv1.WorkspaceCommand
}

// SettleOptions says how long and how often Settle resends. The zero value is usable: every
// field left zero takes the default named beside it (the Python SDK's defaults).
type SettleOptions struct {
	// Timeout bounds all resends together (default 10 minutes). The context's deadline,
	// when earlier, wins.
	Timeout time.Duration
	// AttemptTimeout bounds one call (default 30 s): an answer lost on the way becomes a
	// DEADLINE_EXCEEDED of that attempt, and the identical request is sent again.
	AttemptTimeout time.Duration
	// InitialBackoff is the first pause between resends (default 50 ms); each pause is
	// Multiplier (default 2) times the last, up to MaxBackoff (default 2 s).
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	Multiplier     float64
	// Jitter randomises each pause by up to this fraction (default 0.2; negative: none), so
	// that many clients do not resend in step.
	Jitter float64
	// NoTransportRetry returns UNAVAILABLE, DEADLINE_EXCEEDED and RATE_LIMITED at once
	// instead of resending (resending is safe: the command ID makes it idempotent).
	NoTransportRetry bool
	// OnAnswer, when set, sees every answer (for progress display).
	OnAnswer func(CommandResponse)
	// Sleep waits between resends (default: a timer that ends early with the context). Tests
	// replace it.
	Sleep func(context.Context, time.Duration) error
}

func (o SettleOptions) withDefaults() SettleOptions {
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.AttemptTimeout == 0 {
		o.AttemptTimeout = 30 * time.Second
	}
	if o.InitialBackoff == 0 {
		o.InitialBackoff = 50 * time.Millisecond
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = 2 * time.Second
	}
	if o.Multiplier == 0 {
		o.Multiplier = 2
	}
	if o.Jitter == 0 {
		o.Jitter = 0.2
	}
	if o.Sleep == nil {
		o.Sleep = sleep
	}
	return o
}

// Backoff yields capped exponential pauses: initial, initial*multiplier, ... up to maximum,
// each randomised by up to jitter (a fraction).
type Backoff struct {
	next, maximum time.Duration
	multiplier    float64
	jitter        float64
}

// NewBackoff returns a Backoff starting at initial.
func NewBackoff(initial, maximum time.Duration, multiplier, jitter float64) *Backoff {
	return &Backoff{next: initial, maximum: maximum, multiplier: multiplier, jitter: jitter}
}

// Next returns the next pause.
func (b *Backoff) Next() time.Duration {
	delay := b.next
	if delay > b.maximum {
		delay = b.maximum
	}
	grown := time.Duration(float64(b.next) * b.multiplier)
	if grown > b.maximum {
		grown = b.maximum
	}
	b.next = grown
	if b.jitter > 0 {
		delay = time.Duration(float64(delay) * (1 + b.jitter*(2*rand.Float64()-1)))
	}
	if delay < 0 {
		return 0
	}
	return delay
}

// Reset starts over at initial.
func (b *Backoff) Reset(initial time.Duration) { b.next = initial }

// IsTerminal reports whether a command is SUCCEEDED or FAILED (PENDING and RUNNING mean it
// is still executing).
func IsTerminal(command *ctrlv1.WorkspaceCommand) bool {
	state := command.GetState()
	return state == ctrlv1.CommandState_COMMAND_STATE_SUCCEEDED || state == ctrlv1.CommandState_COMMAND_STATE_FAILED
}

// IsSteady reports whether a workspace is in a state it stays in until someone acts:
// AVAILABLE, STOPPED, FAILED or DELETED.
func IsSteady(workspace *ctrlv1.Workspace) bool {
	switch workspace.GetState() {
	case ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED,
		ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED:
		return true
	}
	return false
}

// Settle calls call, which must send the identical request (the same command ID) each time,
// until the command is terminal, and returns that answer. A command RPC may answer while its
// command is still PENDING or RUNNING; a resend never executes it twice, the server answers
// with the command's current state. Between resends it backs off (capped, exponential).
//
// UNAVAILABLE, DEADLINE_EXCEEDED (of one attempt) and RATE_LIMITED are resent (after the
// delay the server asks for); every other error, INVALID_ARGUMENT among them, is returned at
// once as its typed error. A command that ends FAILED returns the answer and a
// CommandFailedError; giving up returns the last answer and a SettleTimeoutError (the command
// goes on).
func Settle[R CommandResponse](ctx context.Context, options SettleOptions, call func(context.Context) (R, error)) (R, error) {
	o := options.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	backoff := NewBackoff(o.InitialBackoff, o.MaxBackoff, o.Multiplier, o.Jitter)
	var last R
	var lastErr error
	commandID := ""
	lastState := ctrlv1.CommandState_COMMAND_STATE_UNSPECIFIED
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, o.AttemptTimeout)
		response, err := call(attempt)
		cancelAttempt()
		retryDelay := time.Duration(0)
		if err != nil {
			err = FromError(err)
			if ctx.Err() != nil {
				return last, SettleTimeoutError{CommandID: commandID, LastState: lastState, Cause: ctx.Err()}
			}
			if o.NoTransportRetry || !transient(err) {
				return last, err
			}
			lastErr = err
			var limited RateLimitedError
			if errors.As(err, &limited) {
				retryDelay = limited.RetryDelay
			}
		} else {
			last, lastErr = response, nil
			if o.OnAnswer != nil {
				o.OnAnswer(response)
			}
			command := response.GetCommand()
			if command.GetCommandId() != "" {
				commandID = command.GetCommandId()
			}
			lastState = command.GetState()
			if IsTerminal(command) {
				if lastState == ctrlv1.CommandState_COMMAND_STATE_FAILED {
					return response, CommandFailedError{Command: command, Workspace: response.GetWorkspace()}
				}
				return response, nil
			}
		}
		delay := backoff.Next()
		if retryDelay > delay {
			delay = retryDelay
		}
		if deadline, ok := ctx.Deadline(); ok && time.Now().Add(delay).After(deadline) {
			cause := lastErr
			if cause == nil {
				cause = context.DeadlineExceeded
			}
			return last, SettleTimeoutError{CommandID: commandID, LastState: lastState, Cause: cause}
		}
		if err := o.Sleep(ctx, delay); err != nil {
			return last, SettleTimeoutError{CommandID: commandID, LastState: lastState, Cause: err}
		}
	}
}

// transient: worth resending the identical request.
func transient(err error) bool {
	var unavailable UnavailableError
	var deadline DeadlineExceededError
	var limited RateLimitedError
	return errors.As(err, &unavailable) || errors.As(err, &deadline) || errors.As(err, &limited)
}

func sleep(ctx context.Context, delay time.Duration) error {
	timer := time.NewTimer(delay)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
