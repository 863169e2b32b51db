package kibotos

import (
	"context"

	nodev1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/node/v1"
)

// Nodes is the raw kibo.node.v1.NodeAdminService stub (an operator token).
func (c *Client) Nodes() nodev1.NodeAdminServiceClient { return c.nodes }

// ListNodes lists the cluster's nodes: state, capacity and use, labels, lease (operator token).
func (c *Client) ListNodes(ctx context.Context) ([]*nodev1.Node, error) {
	reply, err := c.nodes.ListNodes(ctx, &nodev1.ListNodesRequest{})
	return reply.GetNodes(), err
}

// CordonNode stops new workspaces from being placed on the node; what runs there keeps running.
func (c *Client) CordonNode(ctx context.Context, nodeID string) (*nodev1.Node, error) {
	reply, err := c.nodes.CordonNode(ctx, &nodev1.CordonNodeRequest{NodeId: nodeID})
	return reply.GetNode(), err
}

// UncordonNode places workspaces on the node again (it also ends a drain).
func (c *Client) UncordonNode(ctx context.Context, nodeID string) (*nodev1.Node, error) {
	reply, err := c.nodes.UncordonNode(ctx, &nodev1.UncordonNodeRequest{NodeId: nodeID})
	return reply.GetNode(), err
}

// DrainNode cordons the node and shows it DRAINING until its last instance is gone.
func (c *Client) DrainNode(ctx context.Context, nodeID string) (*nodev1.Node, error) {
	reply, err := c.nodes.DrainNode(ctx, &nodev1.DrainNodeRequest{NodeId: nodeID})
	return reply.GetNode(), err
}

// ForgetNode declares a SILENT node lost for good: what ran there is released (its
// workspaces FAILED, to start elsewhere) and it may never join again under its ID. Refused
// while workspaces keep disks there, unless abandonDisks (they start elsewhere, empty).
func (c *Client) ForgetNode(ctx context.Context, nodeID string, abandonDisks bool) (*nodev1.ForgetNodeResponse, error) {
	return c.nodes.ForgetNode(ctx, &nodev1.ForgetNodeRequest{NodeId: nodeID, AbandonDisks: abandonDisks})
}

// DrainNodeMovingStopped drains the node and moves the disks of its STOPPED workspaces to
// other nodes: a MoveWorkspace command each (Moves, to follow with GetWorkspaceCommand);
// Unmoved names those it could not move, and why.
func (c *Client) DrainNodeMovingStopped(ctx context.Context, nodeID string) (*nodev1.DrainNodeResponse, error) {
	return c.nodes.DrainNode(ctx, &nodev1.DrainNodeRequest{NodeId: nodeID, MoveStopped: true})
}
