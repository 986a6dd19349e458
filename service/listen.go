package service

import (
	"errors"
	"fmt"
	"net"
	"strings"
)

// ErrInsecureListen is the error of CheckListen (and Serve) for a
// non-loopback address without TLS and client authentication.
var ErrInsecureListen = errors.New("service: refusing to listen beyond loopback without TLS and client authentication")

// CheckListen applies the address policy of the network API: a loopback
// address (127.0.0.0/8, ::1, localhost) may be served as cfg says; any
// other address, the wildcard ("", 0.0.0.0, ::) included, only when cfg has
// TLS and authenticates clients (bearer tokens, or client certificates:
// TLS.ClientAuth tls.RequireAndVerifyClientCert with ClientCAs). The error
// wraps ErrInsecureListen and names what is missing. addr is host:port.
//
// Serve applies the same policy to its listener's address.
func CheckListen(addr string, cfg Config) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("service: listen address %q: want host:port: %w", addr, err)
	}
	if isLoopback(host) {
		return nil
	}
	var missing []string
	if cfg.TLS == nil {
		missing = append(missing, "TLS (a server certificate and key)")
	}
	if cfg.clientAuth() == "" {
		missing = append(missing, "client authentication (bearer tokens, or client certificates checked against a CA)")
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s is not a loopback address and the API has no %s", ErrInsecureListen, addr, strings.Join(missing, ", nor "))
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}
