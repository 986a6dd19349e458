package service

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
)

// LoadTokens reads bearer tokens from a file: one token a line; blank lines
// and lines starting with '#' are skipped. Each token must pass the checks
// of Config.Tokens; errors name the line, never the token. A file with no
// token is an error (an empty Tokens would turn authentication off).
//
// Keep the file readable by the server's user only: anyone who reads it can
// call the API.
func LoadTokens(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("service: read tokens: %w", err)
	}
	var tokens []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := validateToken(line); err != nil {
			return nil, fmt.Errorf("service: tokens file %s line %d: token %v", path, n, err)
		}
		tokens = append(tokens, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("service: read tokens %s: %w", path, err)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("service: tokens file %s holds no token", path)
	}
	return tokens, nil
}

// LoadTLS builds a server TLS config from PEM files: the server's
// certificate (chain) and key, and, when clientCAFile is not empty, the CA
// bundle client certificates must chain to (mTLS: every connection must
// present one). TLS 1.2 is the minimum.
func LoadTLS(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, fmt.Errorf("service: TLS needs both a certificate and a key file")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("service: load TLS certificate: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCAFile != "" {
		pem, err := os.ReadFile(clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("service: read client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("service: client CA file %s holds no PEM certificate", clientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
