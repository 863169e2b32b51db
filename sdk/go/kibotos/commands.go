package kibotos

import (
	"context"
	"errors"
	"io"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	simv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/sim/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// The typed helpers: one per RPC of the public services. Command helpers take the request,
// give it a command ID (NewCommandID("kibotos")) when it has none, so the caller can read it
// back to wait, and settle it with the client's SettleOptions: they return the terminal
// answer, or a CommandFailedError beside it.

// withCommandID gives a request's metadata a command ID when it has none.
func withCommandID(metadata *ctrlv1.CommandMetadata) *ctrlv1.CommandMetadata {
	if metadata == nil {
		metadata = &ctrlv1.CommandMetadata{}
	}
	if metadata.CommandId == "" {
		metadata.CommandId = NewCommandID("kibotos")
	}
	return metadata
}

// settled settles request through send, a method of a raw stub.
func settled[Q any, R CommandResponse](ctx context.Context, c *Client, request Q, send func(context.Context, Q, ...grpc.CallOption) (R, error)) (R, error) {
	return Settle(ctx, c.settle, func(ctx context.Context) (R, error) { return send(ctx, request) })
}

// CreateWorkspace creates a workspace, settled (its command is terminal; the workspace may
// still be CREATING: WaitWorkspace follows it to AVAILABLE).
func (c *Client) CreateWorkspace(ctx context.Context, request *ctrlv1.CreateWorkspaceRequest) (*ctrlv1.CreateWorkspaceResponse, error) {
	request.Metadata = withCommandID(request.Metadata)
	return settled(ctx, c, request, c.workspaces.CreateWorkspace)
}

// StopWorkspace stops a workspace (Mode STOP_MODE_FORCE for a force stop), settled.
func (c *Client) StopWorkspace(ctx context.Context, request *ctrlv1.StopWorkspaceRequest) (*ctrlv1.StopWorkspaceResponse, error) {
	request.Metadata = withCommandID(request.Metadata)
	return settled(ctx, c, request, c.workspaces.StopWorkspace)
}

// StartWorkspace starts a STOPPED (or recoverable FAILED) workspace, settled.
func (c *Client) StartWorkspace(ctx context.Context, request *ctrlv1.StartWorkspaceRequest) (*ctrlv1.StartWorkspaceResponse, error) {
	request.Metadata = withCommandID(request.Metadata)
	return settled(ctx, c, request, c.workspaces.StartWorkspace)
}

// DeleteWorkspace deletes a workspace, settled; WaitWorkspaceDeleted follows it to DELETED.
func (c *Client) DeleteWorkspace(ctx context.Context, request *ctrlv1.DeleteWorkspaceRequest) (*ctrlv1.DeleteWorkspaceResponse, error) {
	request.Metadata = withCommandID(request.Metadata)
	return settled(ctx, c, request, c.workspaces.DeleteWorkspace)
}

// SetWorkspaceExpiration sets when the workspace stops or is deleted by itself, settled.
func (c *Client) SetWorkspaceExpiration(ctx context.Context, request *ctrlv1.SetWorkspaceExpirationRequest) (*ctrlv1.SetWorkspaceExpirationResponse, error) {
	request.Metadata = withCommandID(request.Metadata)
	return settled(ctx, c, request, c.workspaces.SetWorkspaceExpiration)
}

// ClearWorkspaceExpiration removes the expiration, settled.
func (c *Client) ClearWorkspaceExpiration(ctx context.Context, request *ctrlv1.ClearWorkspaceExpirationRequest) (*ctrlv1.ClearWorkspaceExpirationResponse, error) {
	request.Metadata = withCommandID(request.Metadata)
	return settled(ctx, c, request, c.workspaces.ClearWorkspaceExpiration)
}

// SetWorkspaceLabels replaces the labels and annotations, settled.
func (c *Client) SetWorkspaceLabels(ctx context.Context, request *ctrlv1.SetWorkspaceLabelsRequest) (*ctrlv1.SetWorkspaceLabelsResponse, error) {
	request.Metadata = withCommandID(request.Metadata)
	return settled(ctx, c, request, c.workspaces.SetWorkspaceLabels)
}

// ResizeWorkspace changes CPU, memory or the writable layer of a STOPPED workspace, settled.
func (c *Client) ResizeWorkspace(ctx context.Context, request *ctrlv1.ResizeWorkspaceRequest) (*ctrlv1.ResizeWorkspaceResponse, error) {
	request.Metadata = withCommandID(request.Metadata)
	return settled(ctx, c, request, c.workspaces.ResizeWorkspace)
}

// MoveWorkspace moves a STOPPED workspace's disks (layer and volumes) to another node: an
// operator's command. It answers at once with the RUNNING command; GetWorkspaceCommand
// follows it (its Progress) until SUCCEEDED (the workspace starts only there from now) or
// FAILED (it stays where it was).
func (c *Client) MoveWorkspace(ctx context.Context, request *ctrlv1.MoveWorkspaceRequest) (*ctrlv1.MoveWorkspaceResponse, error) {
	request.Metadata = withCommandID(request.Metadata)
	return c.workspaces.MoveWorkspace(ctx, request)
}

// SetWorkspaceNetworkPolicy replaces the egress policy, settled (on a STOPPED workspace it
// takes effect at the next start).
func (c *Client) SetWorkspaceNetworkPolicy(ctx context.Context, request *ctrlv1.SetWorkspaceNetworkPolicyRequest) (*ctrlv1.SetWorkspaceNetworkPolicyResponse, error) {
	request.Metadata = withCommandID(request.Metadata)
	return settled(ctx, c, request, c.workspaces.SetWorkspaceNetworkPolicy)
}

// BindWorkspaceVolume binds an existing volume to a STOPPED workspace, settled. Binding a
// volume the workspace already has replaces its binding: that is how to rebind (a new mount
// path, or DeleteWithWorkspace changed).
func (c *Client) BindWorkspaceVolume(ctx context.Context, request *ctrlv1.BindWorkspaceVolumeRequest) (*ctrlv1.BindWorkspaceVolumeResponse, error) {
	request.Metadata = withCommandID(request.Metadata)
	return settled(ctx, c, request, c.workspaces.BindWorkspaceVolume)
}

// UnbindWorkspaceVolume removes a volume's binding from a STOPPED workspace, settled; the
// volume and its data stay.
func (c *Client) UnbindWorkspaceVolume(ctx context.Context, request *ctrlv1.UnbindWorkspaceVolumeRequest) (*ctrlv1.UnbindWorkspaceVolumeResponse, error) {
	request.Metadata = withCommandID(request.Metadata)
	return settled(ctx, c, request, c.workspaces.UnbindWorkspaceVolume)
}

// RevokeWorkspaceDataPlaneAccess invalidates every data-plane credential of the workspace,
// settled.
func (c *Client) RevokeWorkspaceDataPlaneAccess(ctx context.Context, request *ctrlv1.RevokeWorkspaceDataPlaneAccessRequest) (*ctrlv1.RevokeWorkspaceDataPlaneAccessResponse, error) {
	request.Metadata = withCommandID(request.Metadata)
	return settled(ctx, c, request, c.workspaces.RevokeWorkspaceDataPlaneAccess)
}

// CreateWorkspaceExposure gives a TCP port in the guest a URL (the workspace must be AVAILABLE;
// one exposure per port), settled. Access EXPOSURE_ACCESS_TOKEN (or unspecified): requests need
// the answer's Exposure.Token, as the X-Kibo-Exposure-Token header or once ?kibo_token=. The
// token is stored hashed and is only in the answer of the send that made the exposure: it is
// kept from that answer while settling; sending the same command ID again answers without it.
func (c *Client) CreateWorkspaceExposure(ctx context.Context, request *ctrlv1.CreateWorkspaceExposureRequest) (*ctrlv1.CreateWorkspaceExposureResponse, error) {
	request.Metadata = withCommandID(request.Metadata)
	tokens := map[string]string{}
	options := c.settle
	onAnswer := options.OnAnswer
	options.OnAnswer = func(answer CommandResponse) {
		if created, ok := answer.(*ctrlv1.CreateWorkspaceExposureResponse); ok && created.GetExposure().GetToken() != "" {
			tokens[created.GetExposure().GetExposureId()] = created.GetExposure().GetToken()
		}
		if onAnswer != nil {
			onAnswer(answer)
		}
	}
	response, err := Settle(ctx, options, func(ctx context.Context) (*ctrlv1.CreateWorkspaceExposureResponse, error) {
		return c.workspaces.CreateWorkspaceExposure(ctx, request)
	})
	if exposure := response.GetExposure(); exposure != nil && exposure.GetToken() == "" {
		exposure.Token = tokens[exposure.GetExposureId()]
	}
	return response, err
}

// ListWorkspaceExposures returns the workspace's exposures valid now (none after a stop),
// without their tokens.
func (c *Client) ListWorkspaceExposures(ctx context.Context, workspaceID string) ([]*ctrlv1.Exposure, error) {
	reply, err := c.workspaces.ListWorkspaceExposures(ctx, &ctrlv1.ListWorkspaceExposuresRequest{WorkspaceId: workspaceID})
	return reply.GetExposures(), err
}

// DeleteWorkspaceExposure revokes one exposure (the workspace must be AVAILABLE), settled;
// its open connections are cut.
func (c *Client) DeleteWorkspaceExposure(ctx context.Context, request *ctrlv1.DeleteWorkspaceExposureRequest) (*ctrlv1.DeleteWorkspaceExposureResponse, error) {
	request.Metadata = withCommandID(request.Metadata)
	return settled(ctx, c, request, c.workspaces.DeleteWorkspaceExposure)
}

// GetWorkspace reads a workspace (DELETED ones too).
func (c *Client) GetWorkspace(ctx context.Context, workspaceID string) (*ctrlv1.Workspace, error) {
	reply, err := c.workspaces.GetWorkspace(ctx, &ctrlv1.GetWorkspaceRequest{WorkspaceId: workspaceID})
	return reply.GetWorkspace(), err
}

// ListWorkspaces returns every workspace matching request (Filter, IncludeDeleted), all
// pages; PageSize sets the page size, PageToken is ignored.
func (c *Client) ListWorkspaces(ctx context.Context, request *ctrlv1.ListWorkspacesRequest) ([]*ctrlv1.Workspace, error) {
	var all []*ctrlv1.Workspace
	page := &ctrlv1.ListWorkspacesRequest{PageSize: request.GetPageSize(), IncludeDeleted: request.GetIncludeDeleted(), Filter: request.GetFilter()}
	for {
		reply, err := c.workspaces.ListWorkspaces(ctx, page)
		if err != nil {
			return all, err
		}
		all = append(all, reply.GetWorkspaces()...)
		if page.PageToken = reply.GetNextPageToken(); page.PageToken == "" {
			return all, nil
		}
	}
}

// GetWorkspaceCommand reads a command by its ID (its state, result and error).
func (c *Client) GetWorkspaceCommand(ctx context.Context, commandID string) (*ctrlv1.WorkspaceCommand, error) {
	reply, err := c.workspaces.GetWorkspaceCommand(ctx, &ctrlv1.GetWorkspaceCommandRequest{CommandId: commandID})
	return reply.GetCommand(), err
}

// GetCapabilities lists what the server can do (e.g. "workspace.stop.force").
func (c *Client) GetCapabilities(ctx context.Context) ([]string, error) {
	reply, err := c.workspaces.GetCapabilities(ctx, &ctrlv1.GetCapabilitiesRequest{})
	return reply.GetCapabilities(), err
}

// WatchWorkspace calls fn with the current snapshot, then with one per stored change, until
// the stream ends after DELETED (nil), fn returns false (nil), or an error. It does not
// reconnect: WaitWorkspace does.
func (c *Client) WatchWorkspace(ctx context.Context, workspaceID string, fn func(*ctrlv1.Workspace) bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.workspaces.WatchWorkspace(ctx, &ctrlv1.WatchWorkspaceRequest{WorkspaceId: workspaceID})
	if err != nil {
		return err
	}
	for {
		message, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if !fn(message.GetWorkspace()) {
			return nil
		}
	}
}

// GetWorkspaceCleanup says which parts of the workspace's execution are released.
func (c *Client) GetWorkspaceCleanup(ctx context.Context, workspaceID string) (*ctrlv1.WorkspaceCleanup, error) {
	reply, err := c.observation.GetWorkspaceCleanup(ctx, &ctrlv1.GetWorkspaceCleanupRequest{WorkspaceId: workspaceID})
	return reply.GetCleanup(), err
}

// ListWorkspaceEvents returns the workspace's events, all pages.
func (c *Client) ListWorkspaceEvents(ctx context.Context, workspaceID string) ([]*ctrlv1.WorkspaceEvent, error) {
	var all []*ctrlv1.WorkspaceEvent
	page := &ctrlv1.ListWorkspaceEventsRequest{WorkspaceId: workspaceID}
	for {
		reply, err := c.observation.ListWorkspaceEvents(ctx, page)
		if err != nil {
			return all, err
		}
		all = append(all, reply.GetEvents()...)
		if page.PageToken = reply.GetNextPageToken(); page.PageToken == "" {
			return all, nil
		}
	}
}

// ListWorkspaceInstances returns the workspace's instances (one per execution: the current
// one and those still held).
func (c *Client) ListWorkspaceInstances(ctx context.Context, workspaceID string) ([]*ctrlv1.Instance, error) {
	reply, err := c.observation.ListWorkspaceInstances(ctx, &ctrlv1.ListWorkspaceInstancesRequest{WorkspaceId: workspaceID})
	return reply.GetInstances(), err
}

// CreateVolume creates a volume (CapacityGib 0: the server default); the request gets a
// command ID when it has none, so resending it is safe.
func (c *Client) CreateVolume(ctx context.Context, request *ctrlv1.CreateVolumeRequest) (*ctrlv1.Volume, error) {
	request.Metadata = withCommandID(request.Metadata)
	reply, err := c.volumes.CreateVolume(ctx, request)
	return reply.GetVolume(), err
}

// GetVolume reads a volume.
func (c *Client) GetVolume(ctx context.Context, volumeID string) (*ctrlv1.Volume, error) {
	reply, err := c.volumes.GetVolume(ctx, &ctrlv1.GetVolumeRequest{VolumeId: volumeID})
	return reply.GetVolume(), err
}

// DeleteVolume deletes an unbound volume.
func (c *Client) DeleteVolume(ctx context.Context, request *ctrlv1.DeleteVolumeRequest) (*ctrlv1.Volume, error) {
	request.Metadata = withCommandID(request.Metadata)
	reply, err := c.volumes.DeleteVolume(ctx, request)
	return reply.GetVolume(), err
}

// IssueDataPlaneCredential issues a credential for the data-plane calls on an AVAILABLE
// workspace; it is valid until the next stop, force stop, revoke, delete or start.
func (c *Client) IssueDataPlaneCredential(ctx context.Context, workspaceID string) (*ctrlv1.IssueDataPlaneCredentialResponse, error) {
	return c.dataPlane.IssueDataPlaneCredential(ctx, &ctrlv1.IssueDataPlaneCredentialRequest{WorkspaceId: workspaceID})
}

// ExecResult is how a command run in a workspace ended: its exit code and output.
type ExecResult struct {
	ExitCode int32
	Stdout   []byte
	Stderr   []byte
}

// ExecWorkspaceCommand runs request.Argv (no shell) in the workspace and collects its exit
// code and output. Never retried: a failed call may have run the command.
func (c *Client) ExecWorkspaceCommand(ctx context.Context, request *ctrlv1.ExecWorkspaceCommandRequest) (ExecResult, error) {
	var result ExecResult
	stream, err := c.dataPlane.ExecWorkspaceCommand(ctx, request)
	if err != nil {
		return result, err
	}
	for {
		message, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = UnavailableError{localError(codes.Unavailable, ctrlv1.ErrorReason_ERROR_REASON_UNAVAILABLE, "the command's stream ended without an exit code", "")}
			}
			return result, err
		}
		switch output := message.GetOutput().(type) {
		case *ctrlv1.ExecWorkspaceCommandResponse_Stdout:
			result.Stdout = append(result.Stdout, output.Stdout...)
		case *ctrlv1.ExecWorkspaceCommandResponse_Stderr:
			result.Stderr = append(result.Stderr, output.Stderr...)
		case *ctrlv1.ExecWorkspaceCommandResponse_ExitCode:
			result.ExitCode = output.ExitCode
			return result, nil
		}
	}
}

// ReadWorkspaceFile reads a file under a volume mount (an absolute guest path).
func (c *Client) ReadWorkspaceFile(ctx context.Context, credential, path string) ([]byte, error) {
	reply, err := c.dataPlane.ReadWorkspaceFile(ctx, &ctrlv1.ReadWorkspaceFileRequest{Credential: credential, Path: path})
	return reply.GetContent(), err
}

// WriteWorkspaceFile creates or replaces (atomically) a file under a volume mount and
// returns its size.
func (c *Client) WriteWorkspaceFile(ctx context.Context, request *ctrlv1.WriteWorkspaceFileRequest) (int64, error) {
	reply, err := c.dataPlane.WriteWorkspaceFile(ctx, request)
	return reply.GetSize(), err
}

// InjectFault injects a simulator fault (servers run with --runtime sim only).
func (c *Client) InjectFault(ctx context.Context, workspaceID string, fault simv1.Fault) error {
	_, err := c.simulator.InjectFault(ctx, &simv1.InjectFaultRequest{WorkspaceId: workspaceID, Fault: fault})
	return err
}
