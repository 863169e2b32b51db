package kibotos_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	"github.com/kibo-dev/kibo/sdk/go/kibotos"
)

// ListEvents with filters, and WatchEvents following on from a list with none missing.
func TestListAndWatchEvents(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	id := available(ctx, t, client).GetWorkspaceId()
	own, err := client.ListWorkspaceEvents(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	listed, resume, err := client.ListEvents(ctx, kibotos.EventFilter{WorkspaceID: id})
	if err != nil || len(listed) != len(own) || resume < listed[len(listed)-1].GetSequence() {
		t.Fatalf("ListEvents: %d events (ListWorkspaceEvents %d), resume %d: %v", len(listed), len(own), resume, err)
	}
	for i, event := range listed {
		if event.GetSequence() != own[i].GetSequence() || event.GetWorkspaceId() != id {
			t.Fatalf("event %d: %v, want %v", i, event, own[i])
		}
	}
	changes, _, err := client.ListEvents(ctx, kibotos.EventFilter{
		WorkspaceID: id, Types: []ctrlv1.EventType{ctrlv1.EventType_EVENT_TYPE_STATE_CHANGED},
		Start: time.Now().Add(-time.Hour),
	})
	if err != nil || len(changes) == 0 || len(changes) >= len(listed) {
		t.Fatalf("state changes: %d of %d: %v", len(changes), len(listed), err)
	}
	if _, _, err := client.ListEvents(ctx, kibotos.EventFilter{WorkspaceID: "ws-00000000000000000000"}); !errors.As(err, &kibotos.NotFoundError{}) {
		t.Fatalf("a missing workspace: want NotFoundError, got %v", err)
	}
	// Follow on from the list: the stop's events, each once, in order.
	watchCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	seen := make(chan *ctrlv1.WorkspaceEvent, 100)
	done := make(chan error, 1)
	go func() {
		done <- client.WatchEvents(watchCtx, kibotos.EventFilter{WorkspaceID: id}, resume, func(e *ctrlv1.WorkspaceEvent) bool {
			seen <- e
			return e.GetType() != ctrlv1.EventType_EVENT_TYPE_COMMAND_SUCCEEDED
		})
	}()
	if _, err := client.StopWorkspace(ctx, &ctrlv1.StopWorkspaceRequest{WorkspaceId: id}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(seen)
	var watched []int64
	for event := range seen {
		watched = append(watched, event.GetSequence())
	}
	after, _, err := client.ListEvents(ctx, kibotos.EventFilter{WorkspaceID: id})
	if err != nil {
		t.Fatal(err)
	}
	// Exactly the stored events after the list, up to the stop's success.
	var stored []int64
	for _, event := range after {
		if event.GetSequence() > resume && len(watched) > 0 && event.GetSequence() <= watched[len(watched)-1] {
			stored = append(stored, event.GetSequence())
		}
	}
	if len(watched) == 0 || fmt.Sprint(watched) != fmt.Sprint(stored) {
		t.Fatalf("watched %v, stored %v", watched, stored)
	}
}
