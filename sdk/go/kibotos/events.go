package kibotos

import (
	"context"
	"errors"
	"io"
	"time"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// EventFilter narrows ListEvents and WatchEvents. Its zero value matches every event the
// token sees: its tenant's, or with an operator token every tenant's.
type EventFilter struct {
	// Types: only these (none: every type).
	Types []ctrlv1.EventType
	// WorkspaceID: only this workspace's events (one the token cannot see is NotFoundError).
	WorkspaceID string
	// NodeID: only the events that concern this node.
	NodeID string
	// Start (inclusive) and End (exclusive): the events' times; zero: unbounded.
	Start, End time.Time
}

func (f EventFilter) stamps() (start, end *timestamppb.Timestamp) {
	if !f.Start.IsZero() {
		start = timestamppb.New(f.Start)
	}
	if !f.End.IsZero() {
		end = timestamppb.New(f.End)
	}
	return start, end
}

// ListEvents returns every matching event, oldest first (all pages), and the sequence a
// WatchEvents may resume after to follow on from this list with none missing.
func (c *Client) ListEvents(ctx context.Context, filter EventFilter) ([]*ctrlv1.WorkspaceEvent, int64, error) {
	start, end := filter.stamps()
	page := &ctrlv1.ListEventsRequest{
		Types: filter.Types, WorkspaceId: filter.WorkspaceID, NodeId: filter.NodeID,
		StartTime: start, EndTime: end, PageSize: 1000,
	}
	var all []*ctrlv1.WorkspaceEvent
	for {
		reply, err := c.observation.ListEvents(ctx, page)
		if err != nil {
			return all, 0, err
		}
		all = append(all, reply.GetEvents()...)
		if page.PageToken = reply.GetNextPageToken(); page.PageToken == "" {
			return all, reply.GetResumeAfterSequence(), nil
		}
	}
}

// watchBreaks is how many broken streams in a row, with nothing received, WatchEvents calls again.
const watchBreaks = 10

// WatchEvents calls fn with each matching event stored after afterSequence (0: from now on),
// in sequence order, until fn returns false (nil), ctx ends, or an error. A stream that
// breaks (UNAVAILABLE, or CANCELLED by the server: it restarts or stops, the network) is
// called again, once the connection is ready, after the last event it sent: none missed,
// none twice (up to 10 breaks in a row with nothing received).
func (c *Client) WatchEvents(ctx context.Context, filter EventFilter, afterSequence int64, fn func(*ctrlv1.WorkspaceEvent) bool) error {
	start, end := filter.stamps()
	resume, breaks := afterSequence, 0
	for {
		request := &ctrlv1.WatchEventsRequest{
			Types: filter.Types, WorkspaceId: filter.WorkspaceID, NodeId: filter.NodeID,
			StartTime: start, EndTime: end, AfterSequence: resume,
		}
		streamCtx, cancel := context.WithCancel(ctx)
		stream, err := c.observation.WatchEvents(streamCtx, request, grpc.WaitForReady(breaks > 0))
		more := true
		if err == nil {
			more, err = followEvents(stream, &resume, &breaks, fn)
		}
		cancel()
		if !more {
			return err
		}
		breaks++
		// UNAVAILABLE, or CANCELLED by the server (a stop cancels the calls it still serves).
		code := status.Code(err)
		if (code != codes.Unavailable && code != codes.Canceled) || breaks > watchBreaks || ctx.Err() != nil {
			return err
		}
	}
}

// followEvents reads one WatchEvents stream; false when the watch is over (err says why),
// true when the stream broke (err) and may be called again after *resume.
func followEvents(stream ctrlv1.WorkspaceObservationService_WatchEventsClient, resume *int64, breaks *int, fn func(*ctrlv1.WorkspaceEvent) bool) (bool, error) {
	for {
		message, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			return true, err
		}
		*breaks = 0
		if message.GetResumeAfterSequence() > *resume {
			*resume = message.GetResumeAfterSequence()
		}
		if message.GetEvent() != nil && !fn(message.GetEvent()) {
			return false, nil
		}
	}
}
