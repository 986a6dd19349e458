package service_test

import (
	"context"
	"log"
	"net"
	"os/signal"
	"syscall"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stockctl/stockctl/coordinator"
	"github.com/stockctl/stockctl/service"
)

// How a program serves the API: one coordinator per process, a Server in
// front of it, until SIGTERM. (What `stockctl serve --api-addr` does.)
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	coord, err := coordinator.New(client)
	if err != nil {
		log.Fatal(err)
	}
	defer coord.Close()

	tokens, err := service.LoadTokens("/etc/stockctl/api-tokens")
	if err != nil {
		log.Fatal(err)
	}
	tlsConfig, err := service.LoadTLS("/etc/stockctl/api.crt", "/etc/stockctl/api.key", "")
	if err != nil {
		log.Fatal(err)
	}
	cfg := service.Config{Tokens: tokens, TLS: tlsConfig}
	const addr = "0.0.0.0:8443"
	if err := service.CheckListen(addr, cfg); err != nil {
		log.Fatal(err) // names what is missing: TLS, client authentication
	}
	srv, err := service.New(coord, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close() // before coord.Close: releases the locks held for callers
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	if err := srv.Serve(ctx, ln); err != nil {
		log.Fatal(err)
	}
}
