package kibotos

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// EnvToken is the environment variable a token is read from when none is given.
const EnvToken = "KIBO_TOKEN"

// EnvServer is the environment variable the server address is read from when none is given.
const EnvServer = "KIBO_SERVER"

// DefaultAddress is the address of a local kibo-ctrl serve.
const DefaultAddress = "127.0.0.1:50051"

// adminTokenFile is the name of a server's admin token file in its data dir.
const adminTokenFile = "admin.token"

// TokenDiscovery says which token a client uses and how it was found: Source names where it
// came from, Looked every place tried in order, TokenFile the admin.token file it was read
// from (empty otherwise). Token is empty when none was found.
type TokenDiscovery struct {
	Token     string
	Source    string
	Looked    []string
	TokenFile string
}

// Describe says where the token came from, or everywhere it was looked for.
func (d TokenDiscovery) Describe() string {
	if d.Token == "" {
		return "no token found; looked at: " + strings.Join(d.Looked, "; ")
	}
	return "the token came from " + d.Source
}

// DiscoverToken applies the token rule of every kibo client (the Python SDK's
// kibotos.token_discovery, the kibo command line) for a client of the server at address.
// The first that gives a token wins:
//
//  1. token, when not empty (givenAs names it in the description, e.g. "WithToken");
//  2. $KIBO_TOKEN;
//  3. for a loopback server only, so that an admin token never travels to another machine:
//     a. the pointer a local kibo-ctrl serve writes on every start with authentication on,
//     $XDG_STATE_HOME/kibo/servers/HOST_PORT (default ~/.local/state/...), holding the path of
//     that server's DATA_DIR/admin.token (pointers of servers listening on 0.0.0.0 or :: on
//     the same port count too);
//     b. the default data dir's $XDG_DATA_HOME/kibo/admin.token (~/.local/share/...).
func DiscoverToken(address, token, givenAs string) TokenDiscovery {
	if token != "" {
		return TokenDiscovery{Token: token, Source: givenAs, Looked: []string{givenAs}}
	}
	looked := []string{givenAs + " (not given)"}
	if fromEnv := os.Getenv(EnvToken); fromEnv != "" {
		return TokenDiscovery{Token: fromEnv, Source: "$" + EnvToken, Looked: append(looked, "$"+EnvToken)}
	}
	looked = append(looked, "$"+EnvToken+" (not set)")
	if !IsLoopback(address) {
		looked = append(looked, fmt.Sprintf("local token files (not read: %s is not a loopback address)", address))
		return TokenDiscovery{Looked: looked}
	}
	for _, pointer := range pointerCandidates(address) {
		target, ok := readTrimmed(pointer)
		if !ok {
			looked = append(looked, pointer+" (no pointer)")
			continue
		}
		if found, ok := readTrimmed(target); ok {
			source := fmt.Sprintf("%s (via %s)", target, pointer)
			return TokenDiscovery{Token: found, Source: source, Looked: append(looked, source), TokenFile: target}
		}
		looked = append(looked, fmt.Sprintf("%s (named by %s: missing or empty)", target, pointer))
	}
	fallback := DefaultTokenPath()
	if found, ok := readTrimmed(fallback); ok {
		return TokenDiscovery{Token: found, Source: fallback, Looked: append(looked, fallback), TokenFile: fallback}
	}
	return TokenDiscovery{Looked: append(looked, fallback+" (missing)")}
}

// IsLoopback reports whether address (HOST:PORT) names this machine: localhost or a
// loopback IP.
func IsLoopback(address string) bool {
	host, _ := splitAddress(address)
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// DefaultTokenPath is admin.token in the default data dir of kibo-ctrl serve.
func DefaultTokenPath() string {
	return filepath.Join(homeDir("XDG_DATA_HOME", ".local", "share"), "kibo", adminTokenFile)
}

// PointerPath is the pointer file a server listening on address (HOST:PORT) writes.
func PointerPath(address string) string {
	host, port := splitAddress(address)
	switch host {
	case "localhost":
		host = "127.0.0.1"
	case "":
		host = "0.0.0.0"
	}
	return filepath.Join(homeDir("XDG_STATE_HOME", ".local", "state"), "kibo", "servers", host+"_"+port)
}

// splitAddress splits at the last colon and drops IPv6 brackets, as the Python SDK does.
func splitAddress(address string) (host, port string) {
	if i := strings.LastIndex(address, ":"); i >= 0 {
		host, port = address[:i], address[i+1:]
	} else {
		port = address
	}
	return strings.Trim(host, "[]"), port
}

func pointerCandidates(address string) []string {
	_, port := splitAddress(address)
	exact := PointerPath(address)
	candidates := []string{exact}
	for _, wildcard := range []string{"0.0.0.0", "::"} {
		if p := PointerPath("[" + wildcard + "]:" + port); p != exact {
			candidates = append(candidates, p)
		}
	}
	return candidates
}

func homeDir(variable string, fallback ...string) string {
	if value := os.Getenv(variable); value != "" {
		return value
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/"
	}
	return filepath.Join(append([]string{home}, fallback...)...)
}

func readTrimmed(path string) (string, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", false
	}
	text := strings.TrimSpace(string(data))
	return text, text != ""
}
