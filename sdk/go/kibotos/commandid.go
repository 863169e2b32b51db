package kibotos

import (
	"crypto/rand"
	"fmt"
	"regexp"
	"strings"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	"google.golang.org/grpc/codes"
)

// ReservedPrefixes are the command ID prefixes of the server's own stops; a caller's command
// ID may not begin with one.
var ReservedPrefixes = []string{"guest-shutdown/", "host-memory/"}

// commandIDPattern: 1 to 128 characters from A-Z a-z 0-9 . _ ~ : / -
var commandIDPattern = regexp.MustCompile(`^[A-Za-z0-9._~:/-]{1,128}$`)

// CheckCommandID returns nil when the server would accept commandID, else the
// InvalidArgumentError (ReservedCommandIDError for a reserved prefix) it would answer.
func CheckCommandID(commandID string) error {
	if !commandIDPattern.MatchString(commandID) {
		return InvalidArgumentError{localError(codes.InvalidArgument, ctrlv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT,
			fmt.Sprintf("%q is not a command ID: 1 to 128 characters from A-Z a-z 0-9 . _ ~ : / -", commandID), "command_id")}
	}
	for _, prefix := range ReservedPrefixes {
		if strings.HasPrefix(commandID, prefix) {
			return ReservedCommandIDError{localError(codes.InvalidArgument, ctrlv1.ErrorReason_ERROR_REASON_RESERVED_COMMAND_ID,
				fmt.Sprintf("command IDs beginning with %s are reserved for the server", strings.Join(ReservedPrefixes, " or ")),
				"command_id")}
		}
	}
	return nil
}

// NewCommandID returns a fresh command ID, prefix/<random UUID> such as
// "example/6f1c2a4e-...". It panics on a prefix the server would refuse (a reserved one, or
// characters outside the command ID alphabet): that is a bug in the caller, not a run-time
// condition.
func NewCommandID(prefix string) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("kibotos: no randomness for a command ID: %v", err))
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	id := fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
	if prefix = strings.TrimRight(prefix, "/"); prefix != "" {
		id = prefix + "/" + id
	}
	if err := CheckCommandID(id); err != nil {
		panic(fmt.Sprintf("kibotos.NewCommandID(%q): %v", prefix, err))
	}
	return id
}
