package kibotos

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"os"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	nodev1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/node/v1"
	simv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/sim/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Client is a connection to a kibo server: the raw generated stubs (Workspaces, Observation,
// Volumes, DataPlane, Simulator) and typed helpers on top. Safe for concurrent use.
type Client struct {
	conn        *grpc.ClientConn
	address     string
	discovery   TokenDiscovery
	settle      SettleOptions
	waitOptions WaitOptions
	workspaces  ctrlv1.WorkspaceServiceClient
	observation ctrlv1.WorkspaceObservationServiceClient
	volumes     ctrlv1.VolumeServiceClient
	dataPlane   ctrlv1.DataPlaneServiceClient
	simulator   simv1.SimulatorServiceClient
	nodes       nodev1.NodeAdminServiceClient
}

// Option configures New.
type Option func(*config)

type config struct {
	token       string
	tls         credentials.TransportCredentials
	dial        []grpc.DialOption
	settle      SettleOptions
	waitOptions WaitOptions
}

// WithToken sends token as "authorization: Bearer TOKEN" on every call. Without it the token
// comes from DiscoverToken ($KIBO_TOKEN, then a local server's admin token).
func WithToken(token string) Option { return func(c *config) { c.token = token } }

// WithTLS connects with TLS configured by cfg (nil: the system roots). Without it the
// connection is plaintext, as kibo-ctrl serve listens by default.
func WithTLS(cfg *tls.Config) Option {
	return func(c *config) {
		if cfg == nil {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		c.tls = credentials.NewTLS(cfg)
	}
}

// WithTransportCredentials connects with the given transport credentials (e.g. mutual TLS
// from credentials.NewClientTLSFromFile).
func WithTransportCredentials(creds credentials.TransportCredentials) Option {
	return func(c *config) { c.tls = creds }
}

// WithDialOptions adds grpc.DialOptions (interceptors, keepalive, a custom dialer).
func WithDialOptions(options ...grpc.DialOption) Option {
	return func(c *config) { c.dial = append(c.dial, options...) }
}

// WithSettleOptions sets the options of the client's command helpers (CreateWorkspace, ...).
func WithSettleOptions(options SettleOptions) Option { return func(c *config) { c.settle = options } }

// WithWaitOptions sets the options of WaitWorkspace and WaitWorkspaceDeleted.
func WithWaitOptions(options WaitOptions) Option { return func(c *config) { c.waitOptions = options } }

// ResolveAddress is address, else $KIBO_SERVER, else DefaultAddress.
func ResolveAddress(address string) string {
	if address != "" {
		return address
	}
	if fromEnv := os.Getenv(EnvServer); fromEnv != "" {
		return fromEnv
	}
	return DefaultAddress
}

// New returns a client of the server at address (HOST:PORT; empty: $KIBO_SERVER, else
// 127.0.0.1:50051). It does not wait for the connection: the first call does, and gRPC
// reconnects by itself after a server restart. Close it when done.
func New(address string, options ...Option) (*Client, error) {
	cfg := config{}
	for _, option := range options {
		option(&cfg)
	}
	address = ResolveAddress(address)
	c := &Client{address: address, discovery: DiscoverToken(address, cfg.token, "WithToken"), settle: cfg.settle, waitOptions: cfg.waitOptions}
	dial := []grpc.DialOption{
		grpc.WithUserAgent("kibotos-go/0.1"),
		grpc.WithChainUnaryInterceptor(c.unaryErrors),
		grpc.WithChainStreamInterceptor(c.streamErrors),
	}
	if cfg.tls != nil {
		dial = append(dial, grpc.WithTransportCredentials(cfg.tls))
	} else {
		dial = append(dial, grpc.WithInsecure())
	}
	if c.discovery.Token != "" {
		dial = append(dial, grpc.WithPerRPCCredentials(bearer(c.discovery.Token)))
	}
	conn, err := grpc.Dial(address, append(dial, cfg.dial...)...)
	if err != nil {
		return nil, err
	}
	c.conn = conn
	c.workspaces = ctrlv1.NewWorkspaceServiceClient(conn)
	c.observation = ctrlv1.NewWorkspaceObservationServiceClient(conn)
	c.volumes = ctrlv1.NewVolumeServiceClient(conn)
	c.dataPlane = ctrlv1.NewDataPlaneServiceClient(conn)
	c.simulator = simv1.NewSimulatorServiceClient(conn)
	c.nodes = nodev1.NewNodeAdminServiceClient(conn)
	return c, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Address is the server address the client talks to.
func (c *Client) Address() string { return c.address }

// Conn is the underlying gRPC connection (for stubs of other services).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// TokenDiscovery says which token the client sends and where it came from.
func (c *Client) TokenDiscovery() TokenDiscovery { return c.discovery }

// SettleOptions are the options the client's command helpers settle with.
func (c *Client) SettleOptions() SettleOptions { return c.settle }

// Workspaces is the raw kibo.ctrl.v1.WorkspaceService stub.
func (c *Client) Workspaces() ctrlv1.WorkspaceServiceClient { return c.workspaces }

// Observation is the raw kibo.ctrl.v1.WorkspaceObservationService stub.
func (c *Client) Observation() ctrlv1.WorkspaceObservationServiceClient { return c.observation }

// Volumes is the raw kibo.ctrl.v1.VolumeService stub.
func (c *Client) Volumes() ctrlv1.VolumeServiceClient { return c.volumes }

// DataPlane is the raw kibo.ctrl.v1.DataPlaneService stub.
func (c *Client) DataPlane() ctrlv1.DataPlaneServiceClient { return c.dataPlane }

// Simulator is the raw kibo.sim.v1.SimulatorService stub (servers run with --runtime sim only).
func (c *Client) Simulator() simv1.SimulatorServiceClient { return c.simulator }

// explain types an error and, for UNAUTHENTICATED, says where the token came from.
func (c *Client) explain(err error) error {
	err = FromError(err)
	var unauthenticated UnauthenticatedError
	if errors.As(err, &unauthenticated) && unauthenticated.TokenDiscovery == "" {
		unauthenticated.TokenDiscovery = c.discovery.Describe()
		if c.discovery.Token != "" {
			unauthenticated.TokenDiscovery += "; the server refused it: a server started with --data-dir DIR keeps its admin token in DIR/admin.token"
		} else {
			unauthenticated.TokenDiscovery += "; a local kibo-ctrl serve writes DATA_DIR/admin.token on first start: pass it with WithToken or $KIBO_TOKEN"
		}
		return unauthenticated
	}
	return err
}

func (c *Client) unaryErrors(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return c.explain(invoker(ctx, method, req, reply, cc, opts...))
}

func (c *Client) streamErrors(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	stream, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, c.explain(err)
	}
	return typedStream{ClientStream: stream, client: c}, nil
}

// typedStream types the errors a stream's Recv returns (io.EOF stays io.EOF).
type typedStream struct {
	grpc.ClientStream
	client *Client
}

// RecvMsg receives the next message, its error typed.
func (s typedStream) RecvMsg(m interface{}) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil || errors.Is(err, io.EOF) {
		return err
	}
	return s.client.explain(err)
}

// bearer sends the token with every call. kibo-ctrl serve listens without TLS by default, so
// it does not require transport security (use TLS for a server on another machine).
type bearer string

// GetRequestMetadata is the authorization header of every call.
func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false: the token may go over plaintext to a local server.
func (bearer) RequireTransportSecurity() bool { return false }
