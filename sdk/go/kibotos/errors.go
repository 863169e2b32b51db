package kibotos

import (
	"errors"
	"fmt"
	"strings"
	"time"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// APIError is a rejection by the server (or, for CheckCommandID, one the server would make):
// the gRPC code and message, and the details kibo attaches to every rejection. Every typed
// error below wraps one, so errors.As(err, &apiErr) with apiErr of type *APIError finds it
// whatever the case.
type APIError struct {
	// Code is the gRPC status code.
	Code codes.Code
	// Message is the status message.
	Message string
	// Detail is the kibo.ctrl.v1.ErrorDetail of the status details (never nil; empty when
	// the server sent none).
	Detail *ctrlv1.ErrorDetail
	// Info is the google.rpc.ErrorInfo of the status details (never nil).
	Info *errdetails.ErrorInfo
	// RetryDelay is the google.rpc.RetryInfo delay (RATE_LIMITED); 0 when none was sent.
	RetryDelay time.Duration
	status     *status.Status
}

// Error is the code and the message, e.g. "FailedPrecondition: workspace is AVAILABLE".
func (e *APIError) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Message) }

// GRPCStatus lets status.FromError and status.Code read a typed error as the status it came from.
func (e *APIError) GRPCStatus() *status.Status { return e.status }

// Reason is the ErrorDetail reason without its prefix ("CONFLICT", "NOT_FOUND", ...), else
// the ErrorInfo reason; empty when the server sent neither.
func (e *APIError) Reason() string {
	if e.Detail.GetReason() != ctrlv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
		return strings.TrimPrefix(e.Detail.GetReason().String(), "ERROR_REASON_")
	}
	return e.Info.GetReason()
}

// Field is the request field at fault (INVALID_ARGUMENT).
func (e *APIError) Field() string { return e.Detail.GetField() }

// WorkspaceState is the workspace state a CONFLICT met.
func (e *APIError) WorkspaceState() string { return e.Detail.GetWorkspaceState() }

// Hint is what the caller can do next, e.g. "force stop first, then start".
func (e *APIError) Hint() string { return e.Detail.GetHint() }

// InvalidArgumentError is INVALID_ARGUMENT: a malformed request (bad field, bad command ID).
type InvalidArgumentError struct{ *APIError }

// Unwrap gives the APIError.
func (e InvalidArgumentError) Unwrap() error { return e.APIError }

// ReservedCommandIDError is INVALID_ARGUMENT with reason RESERVED_COMMAND_ID: guest-shutdown/
// and host-memory/ are the server's. It is an InvalidArgumentError too.
type ReservedCommandIDError struct{ *APIError }

// Unwrap gives the InvalidArgumentError it also is.
func (e ReservedCommandIDError) Unwrap() error { return InvalidArgumentError(e) }

// NotFoundError is NOT_FOUND: no such workspace, command or volume.
type NotFoundError struct{ *APIError }

// Unwrap gives the APIError.
func (e NotFoundError) Unwrap() error { return e.APIError }

// CommandIDReusedError is ALREADY_EXISTS: the command ID was already used for another request.
type CommandIDReusedError struct{ *APIError }

// Unwrap gives the APIError.
func (e CommandIDReusedError) Unwrap() error { return e.APIError }

// AbortedError is ABORTED: expected_expiration_revision does not match (REVISION_MISMATCH);
// nothing changed.
type AbortedError struct{ *APIError }

// Unwrap gives the APIError.
func (e AbortedError) Unwrap() error { return e.APIError }

// ConflictError is FAILED_PRECONDITION (reason CONFLICT): the workspace's state does not allow
// the operation; it is unchanged. WorkspaceState says which state it met, Hint what to do.
type ConflictError struct{ *APIError }

// Unwrap gives the APIError.
func (e ConflictError) Unwrap() error { return e.APIError }

// UnavailableError is UNAVAILABLE: the server cannot be reached right now. Resending a
// command with its command ID is safe.
type UnavailableError struct{ *APIError }

// Unwrap gives the APIError.
func (e UnavailableError) Unwrap() error { return e.APIError }

// DeadlineExceededError is DEADLINE_EXCEEDED: the call ran out of time; a command may or may
// not have been recorded (resend it with the same command ID to know).
type DeadlineExceededError struct{ *APIError }

// Unwrap gives the APIError.
func (e DeadlineExceededError) Unwrap() error { return e.APIError }

// UnauthenticatedError is UNAUTHENTICATED: the server needs a valid token. TokenDiscovery
// says where the client's token came from, or every place it looked.
type UnauthenticatedError struct {
	*APIError
	TokenDiscovery string
}

// Error includes where the token came from.
func (e UnauthenticatedError) Error() string {
	if e.TokenDiscovery == "" {
		return e.APIError.Error()
	}
	return fmt.Sprintf("%s (%s)", e.APIError.Error(), e.TokenDiscovery)
}

// Unwrap gives the APIError.
func (e UnauthenticatedError) Unwrap() error { return e.APIError }

// PermissionDeniedError is PERMISSION_DENIED: the token's role does not allow the call.
type PermissionDeniedError struct{ *APIError }

// Unwrap gives the APIError.
func (e PermissionDeniedError) Unwrap() error { return e.APIError }

// ResourceExhaustedError is RESOURCE_EXHAUSTED: a limit was hit (a quota, the request rate,
// the message size).
type ResourceExhaustedError struct{ *APIError }

// Unwrap gives the APIError.
func (e ResourceExhaustedError) Unwrap() error { return e.APIError }

// QuotaExceededError is RESOURCE_EXHAUSTED with reason QUOTA_EXCEEDED: a per-tenant quota
// would be exceeded. It is a ResourceExhaustedError too.
type QuotaExceededError struct{ *APIError }

// Unwrap gives the ResourceExhaustedError it also is.
func (e QuotaExceededError) Unwrap() error { return ResourceExhaustedError(e) }

// RateLimitedError is RESOURCE_EXHAUSTED with reason RATE_LIMITED: retry after RetryDelay
// (nothing was recorded). It is a ResourceExhaustedError too.
type RateLimitedError struct{ *APIError }

// Unwrap gives the ResourceExhaustedError it also is.
func (e RateLimitedError) Unwrap() error { return ResourceExhaustedError(e) }

// UnimplementedError is UNIMPLEMENTED: this server cannot do it at all (e.g. the simulated
// runtime has no data plane, or the server predates the RPC).
type UnimplementedError struct{ *APIError }

// Unwrap gives the APIError.
func (e UnimplementedError) Unwrap() error { return e.APIError }

// InternalError is INTERNAL: a bug in the server; not retried, the same request would meet it
// again.
type InternalError struct{ *APIError }

// ErrorID is what the server logged with the details; quote it in a bug report.
func (e InternalError) ErrorID() string { return e.Info.GetMetadata()["error_id"] }

// Unwrap gives the APIError.
func (e InternalError) Unwrap() error { return e.APIError }

// CommandFailedError says a command ended COMMAND_STATE_FAILED. Status is its error (code
// CANCELLED when another command superseded it).
type CommandFailedError struct {
	Command   *ctrlv1.WorkspaceCommand
	Workspace *ctrlv1.Workspace
}

// Error names the command, its error message and code.
func (e CommandFailedError) Error() string {
	message := e.Command.GetError().GetMessage()
	if message == "" {
		message = "no message"
	}
	return fmt.Sprintf("command %s failed: %s (%s)", e.Command.GetCommandId(), message, e.StatusCode())
}

// StatusCode is the command error's code.
func (e CommandFailedError) StatusCode() codes.Code {
	return codes.Code(e.Command.GetError().GetCode())
}

// Cancelled tells a command that was superseded or cancelled.
func (e CommandFailedError) Cancelled() bool { return e.StatusCode() == codes.Canceled }

// SettleTimeoutError says Settle gave up before the command was terminal. The command goes
// on: query it with GetWorkspaceCommand.
type SettleTimeoutError struct {
	CommandID string
	// LastState is the command state of the last answer ("" when none came).
	LastState ctrlv1.CommandState
	// Cause is the context's error, or the last transport error when no answer came.
	Cause error
}

// Error says what was still executing.
func (e SettleTimeoutError) Error() string {
	what := "the command"
	if e.CommandID != "" {
		what = "command " + e.CommandID
	}
	if e.LastState != ctrlv1.CommandState_COMMAND_STATE_UNSPECIFIED {
		return fmt.Sprintf("gave up settling %s: still %s (%v); it goes on, query it with GetWorkspaceCommand", what, e.LastState, e.Cause)
	}
	return fmt.Sprintf("gave up settling %s: not answered (%v)", what, e.Cause)
}

// Unwrap gives the cause (context.DeadlineExceeded, context.Canceled or a transport error).
func (e SettleTimeoutError) Unwrap() error { return e.Cause }

// WaitTimeoutError says a wait gave up (its context ended) before the command was terminal
// and the workspace steady. Nothing was cancelled.
type WaitTimeoutError struct {
	WorkspaceID string
	CommandID   string
	// Workspace is the last snapshot seen (nil when none was read).
	Workspace *ctrlv1.Workspace
	// Command is the last state of the command waited for (nil when not read).
	Command *ctrlv1.WorkspaceCommand
	Cause   error
}

// Error says where the wait stood.
func (e WaitTimeoutError) Error() string {
	what := "workspace " + e.WorkspaceID
	if e.CommandID != "" {
		what = "command " + e.CommandID
	}
	state := "not read yet"
	if e.Workspace != nil {
		state = e.Workspace.GetState().String()
	}
	command := ""
	if e.Command != nil {
		command = ", command " + e.Command.GetState().String()
	}
	return fmt.Sprintf("gave up waiting for %s: workspace %s%s (%v); nothing was cancelled", what, state, command, e.Cause)
}

// Unwrap gives the cause (the context's error).
func (e WaitTimeoutError) Unwrap() error { return e.Cause }

// FromError turns a gRPC status error into the matching typed error (a value such as
// ConflictError, wrapping an *APIError). Errors that are already typed, nil, and errors that
// carry no gRPC status are returned unchanged.
func FromError(err error) error {
	if err == nil {
		return nil
	}
	var already *APIError
	if errors.As(err, &already) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	return typed(apiError(st))
}

func apiError(st *status.Status) *APIError {
	e := &APIError{Code: st.Code(), Message: st.Message(), Detail: &ctrlv1.ErrorDetail{}, Info: &errdetails.ErrorInfo{}, status: st}
	for _, detail := range st.Details() {
		switch d := detail.(type) {
		case *ctrlv1.ErrorDetail:
			e.Detail = d
		case *errdetails.ErrorInfo:
			e.Info = d
		case *errdetails.RetryInfo:
			e.RetryDelay = d.GetRetryDelay().AsDuration()
		}
	}
	return e
}

func localError(code codes.Code, reason ctrlv1.ErrorReason, message, field string) *APIError {
	e := apiError(status.New(code, message))
	e.Detail = &ctrlv1.ErrorDetail{Reason: reason, Field: field}
	return e
}

// typed picks the error type by reason where the reason is finer than the code, else by code.
func typed(e *APIError) error {
	switch e.Detail.GetReason() {
	case ctrlv1.ErrorReason_ERROR_REASON_RESERVED_COMMAND_ID:
		return ReservedCommandIDError{e}
	case ctrlv1.ErrorReason_ERROR_REASON_QUOTA_EXCEEDED:
		return QuotaExceededError{e}
	case ctrlv1.ErrorReason_ERROR_REASON_RATE_LIMITED:
		return RateLimitedError{e}
	}
	switch e.Code {
	case codes.InvalidArgument:
		return InvalidArgumentError{e}
	case codes.NotFound:
		return NotFoundError{e}
	case codes.AlreadyExists:
		return CommandIDReusedError{e}
	case codes.Aborted:
		return AbortedError{e}
	case codes.FailedPrecondition:
		return ConflictError{e}
	case codes.Unavailable:
		return UnavailableError{e}
	case codes.DeadlineExceeded:
		return DeadlineExceededError{e}
	case codes.Unauthenticated:
		return UnauthenticatedError{APIError: e}
	case codes.PermissionDenied:
		return PermissionDeniedError{e}
	case codes.ResourceExhausted:
		return ResourceExhaustedError{e}
	case codes.Unimplemented:
		return UnimplementedError{e}
	case codes.Internal:
		return InternalError{e}
	}
	return e
}
