package kibotos_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	"github.com/kibo-dev/kibo/sdk/go/kibotos"
)

// The helpers of the rest of the API: volumes bound, rebound and unbound, network policy,
// data-plane revoke, instances, events, cleanup.
func TestVolumeBindingNetworkPolicyRevokeAndInstances(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	id := available(ctx, t, client).GetWorkspaceId()
	instances, err := client.ListWorkspaceInstances(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(instances) == 0 || instances[0].GetPhase() != ctrlv1.InstancePhase_INSTANCE_PHASE_RUNNING {
		t.Fatalf("instances of an AVAILABLE workspace: %v", instances)
	}
	revoked, err := client.RevokeWorkspaceDataPlaneAccess(ctx, &ctrlv1.RevokeWorkspaceDataPlaneAccessRequest{WorkspaceId: id})
	if err != nil || revoked.GetCommand().GetState() != ctrlv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Fatalf("revoke: %v %v", revoked.GetCommand().GetState(), err)
	}
	// Binding needs STOPPED: a bind now is a typed conflict.
	volume, err := client.CreateVolume(ctx, &ctrlv1.CreateVolumeRequest{CapacityGib: 1})
	if err != nil {
		t.Fatal(err)
	}
	bind := &ctrlv1.BindWorkspaceVolumeRequest{WorkspaceId: id, Binding: &ctrlv1.VolumeBinding{VolumeId: volume.GetVolumeId(), MountPath: "/mnt/shared"}}
	if _, err := client.BindWorkspaceVolume(ctx, bind); !errors.As(err, &kibotos.ConflictError{}) {
		t.Fatalf("bind on AVAILABLE: want ConflictError, got %v", err)
	}
	if _, err := client.StopWorkspace(ctx, &ctrlv1.StopWorkspaceRequest{WorkspaceId: id}); err != nil {
		t.Fatal(err)
	}
	bind.Metadata = nil // a new command
	bound, err := client.BindWorkspaceVolume(ctx, bind)
	if err != nil {
		t.Fatal(err)
	}
	if b := binding(bound.GetWorkspace(), volume.GetVolumeId()); b == nil || b.GetMountPath() != "/mnt/shared" || b.GetDeleteWithWorkspace() {
		t.Fatalf("bound: %v", b)
	}
	rebind := &ctrlv1.BindWorkspaceVolumeRequest{WorkspaceId: id, Binding: &ctrlv1.VolumeBinding{VolumeId: volume.GetVolumeId(), MountPath: "/mnt/other", DeleteWithWorkspace: true}}
	rebound, err := client.BindWorkspaceVolume(ctx, rebind)
	if err != nil {
		t.Fatal(err)
	}
	if b := binding(rebound.GetWorkspace(), volume.GetVolumeId()); b == nil || b.GetMountPath() != "/mnt/other" || !b.GetDeleteWithWorkspace() {
		t.Fatalf("rebound: %v", b)
	}
	unbound, err := client.UnbindWorkspaceVolume(ctx, &ctrlv1.UnbindWorkspaceVolumeRequest{WorkspaceId: id, VolumeId: volume.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	if b := binding(unbound.GetWorkspace(), volume.GetVolumeId()); b != nil {
		t.Fatalf("still bound: %v", b)
	}
	policy := &ctrlv1.NetworkPolicy{
		Egress:         ctrlv1.NetworkEgress_NETWORK_EGRESS_ALLOW_LISTED,
		AllowedCidrs:   []string{"10.0.0.0/8"},
		DeniedCidrs:    []string{"10.9.0.0/16"},
		AllowedDomains: []string{"api.github.com", "*.pypi.org"},
		DeniedDomains:  []string{"evil.pypi.org"},
		AllowedPorts:   []uint32{443, 22},
	}
	set, err := client.SetWorkspaceNetworkPolicy(ctx, &ctrlv1.SetWorkspaceNetworkPolicyRequest{WorkspaceId: id, NetworkPolicy: policy})
	if err != nil {
		t.Fatal(err)
	}
	got := set.GetWorkspace().GetSpec().GetNetworkPolicy()
	if got.GetEgress() != policy.Egress || len(got.GetAllowedCidrs()) != 1 || len(got.GetDeniedCidrs()) != 1 ||
		strings.Join(got.GetAllowedDomains(), ",") != "api.github.com,*.pypi.org" ||
		strings.Join(got.GetDeniedDomains(), ",") != "evil.pypi.org" || len(got.GetAllowedPorts()) != 2 {
		t.Fatalf("policy: %v", got)
	}
	// A combination the server refuses (a denied CIDR under DENY_ALL) is an InvalidArgumentError.
	refused := &ctrlv1.NetworkPolicy{Egress: ctrlv1.NetworkEgress_NETWORK_EGRESS_DENY_ALL, DeniedCidrs: []string{"10.0.0.0/8"}}
	if _, err := client.SetWorkspaceNetworkPolicy(ctx, &ctrlv1.SetWorkspaceNetworkPolicyRequest{WorkspaceId: id, NetworkPolicy: refused}); !errors.As(err, &kibotos.InvalidArgumentError{}) {
		t.Fatalf("denied CIDRs under DENY_ALL: want InvalidArgumentError, got %v", err)
	}
	if _, err := client.DeleteVolume(ctx, &ctrlv1.DeleteVolumeRequest{VolumeId: volume.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	events, err := client.ListWorkspaceEvents(ctx, id)
	if err != nil || len(events) == 0 {
		t.Fatalf("events: %d %v", len(events), err)
	}
	if _, err := client.GetWorkspaceCleanup(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// Exposures: a token exposure's token comes once, with its create; the list shows both
// exposures without tokens; a delete and a stop end them.
func TestWorkspaceExposures(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	id := available(ctx, t, client).GetWorkspaceId()
	created, err := client.CreateWorkspaceExposure(ctx, &ctrlv1.CreateWorkspaceExposureRequest{WorkspaceId: id, Port: 8080})
	if err != nil {
		t.Fatal(err)
	}
	exposure := created.GetExposure()
	if exposure.GetAccess() != ctrlv1.ExposureAccess_EXPOSURE_ACCESS_TOKEN || exposure.GetToken() == "" ||
		!strings.Contains(exposure.GetUrl(), "8080-"+id+".") || exposure.GetExpireTime() != nil {
		t.Fatalf("token exposure: %v", exposure)
	}
	public, err := client.CreateWorkspaceExposure(ctx, &ctrlv1.CreateWorkspaceExposureRequest{
		WorkspaceId: id, Port: 3000, Access: ctrlv1.ExposureAccess_EXPOSURE_ACCESS_PUBLIC, ExpireInSeconds: 3600,
	})
	if err != nil {
		t.Fatal(err)
	}
	if p := public.GetExposure(); p.GetToken() != "" || p.GetExpireTime() == nil || p.GetAccess() != ctrlv1.ExposureAccess_EXPOSURE_ACCESS_PUBLIC {
		t.Fatalf("public exposure: %v", p)
	}
	if _, err := client.CreateWorkspaceExposure(ctx, &ctrlv1.CreateWorkspaceExposureRequest{WorkspaceId: id, Port: 70000}); !errors.As(err, &kibotos.InvalidArgumentError{}) {
		t.Fatalf("port 70000: want InvalidArgumentError, got %v", err)
	}
	listed, err := client.ListWorkspaceExposures(ctx, id)
	if err != nil || len(listed) != 2 {
		t.Fatalf("listed: %v %v", listed, err)
	}
	for _, e := range listed {
		if e.GetToken() != "" {
			t.Fatalf("a listed exposure shows its token: %v", e)
		}
	}
	deleted, err := client.DeleteWorkspaceExposure(ctx, &ctrlv1.DeleteWorkspaceExposureRequest{WorkspaceId: id, ExposureId: exposure.GetExposureId()})
	if err != nil || deleted.GetCommand().GetState() != ctrlv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Fatalf("delete: %v %v", deleted.GetCommand().GetState(), err)
	}
	if listed, err = client.ListWorkspaceExposures(ctx, id); err != nil || len(listed) != 1 || listed[0].GetPort() != 3000 {
		t.Fatalf("after the delete: %v %v", listed, err)
	}
	if _, err := client.StopWorkspace(ctx, &ctrlv1.StopWorkspaceRequest{WorkspaceId: id}); err != nil {
		t.Fatal(err)
	}
	if listed, err = client.ListWorkspaceExposures(ctx, id); err != nil || len(listed) != 0 {
		t.Fatalf("after a stop: %v %v", listed, err)
	}
	if _, err := client.CreateWorkspaceExposure(ctx, &ctrlv1.CreateWorkspaceExposureRequest{WorkspaceId: id, Port: 8080}); !errors.As(err, &kibotos.ConflictError{}) {
		t.Fatalf("expose on STOPPED: want ConflictError, got %v", err)
	}
}

func binding(workspace *ctrlv1.Workspace, volumeID string) *ctrlv1.VolumeBinding {
	for _, b := range workspace.GetSpec().GetVolumes() {
		if b.GetVolumeId() == volumeID {
			return b
		}
	}
	return nil
}

// The token rule of the Python SDK: given, else $KIBO_TOKEN, else (loopback only) the
// pointer a local server writes, else the default data dir's admin.token.
func TestTokenDiscoveryFollowsThePythonRule(t *testing.T) {
	state, data := t.TempDir(), t.TempDir()
	t.Setenv("XDG_STATE_HOME", state)
	t.Setenv("XDG_DATA_HOME", data)
	t.Setenv(kibotos.EnvToken, "")
	if d := kibotos.DiscoverToken("127.0.0.1:7", "given", "WithToken"); d.Token != "given" || d.Source != "WithToken" {
		t.Fatalf("given: %+v", d)
	}
	if d := kibotos.DiscoverToken("127.0.0.1:7", "", "WithToken"); d.Token != "" || !strings.Contains(d.Describe(), "no token found") {
		t.Fatalf("none: %+v", d)
	}
	// A server on 0.0.0.0:7 recorded where its admin token is.
	tokenFile := filepath.Join(t.TempDir(), "admin.token")
	write(t, tokenFile, "from-pointer\n")
	write(t, filepath.Join(state, "kibo", "servers", "0.0.0.0_7"), tokenFile+"\n")
	if d := kibotos.DiscoverToken("localhost:7", "", "WithToken"); d.Token != "from-pointer" || d.TokenFile != tokenFile {
		t.Fatalf("pointer: %+v", d)
	}
	// Never for another machine.
	if d := kibotos.DiscoverToken("192.0.2.1:7", "", "WithToken"); d.Token != "" || !strings.Contains(d.Describe(), "not a loopback address") {
		t.Fatalf("remote: %+v", d)
	}
	write(t, filepath.Join(data, "kibo", "admin.token"), "from-default")
	if d := kibotos.DiscoverToken("127.0.0.1:8", "", "WithToken"); d.Token != "from-default" {
		t.Fatalf("default: %+v", d)
	}
	t.Setenv(kibotos.EnvToken, "from-env")
	if d := kibotos.DiscoverToken("127.0.0.1:7", "", "WithToken"); d.Token != "from-env" || d.Source != "$KIBO_TOKEN" {
		t.Fatalf("env: %+v", d)
	}
}

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}
