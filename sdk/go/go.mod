module github.com/kibo-dev/kibo/sdk/go

go 1.19

// The versions Debian 12 packages; the SDK builds offline there in GOPATH mode (sdk/go/go.sh).
// In module mode (with network) run `go mod tidy` once: it adds genproto, which grpc-go pulls
// in for google.golang.org/genproto/googleapis/rpc, and writes go.sum.
require (
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)
