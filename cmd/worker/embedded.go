package main

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// defaultEmbeddedAddr is where the embedded NATS server listens when NATS_URL is unset.
const defaultEmbeddedAddr = "127.0.0.1:4222"

// embeddedConfig configures the embedded NATS server.
type embeddedConfig struct {
	// Addr is host:port to listen on; empty means defaultEmbeddedAddr. Port 0 picks a
	// free port.
	Addr string
	// StoreDir is where JetStream keeps its data; required, so that jobs survive a
	// restart of the worker.
	StoreDir string
	// ServerName names the server; empty means "jazzmine-embedded".
	ServerName string
}

// startEmbedded starts an in-process NATS server with JetStream, for running the whole
// system with one command. Any NATS client can reach it at its ClientURL. The caller
// shuts it down with Shutdown and WaitForShutdown.
func startEmbedded(cfg embeddedConfig) (*server.Server, error) {
	if cfg.Addr == "" {
		cfg.Addr = defaultEmbeddedAddr
	}
	if cfg.StoreDir == "" {
		return nil, fmt.Errorf("embedded NATS: a JetStream store directory is required")
	}
	if cfg.ServerName == "" {
		cfg.ServerName = "jazzmine-embedded"
	}
	host, portStr, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: address %q: %w", cfg.Addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: port %q: %w", portStr, err)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		ServerName: cfg.ServerName,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true,
		NoLog:      true,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded NATS: not ready on %s within 10s (is the port in use?)", cfg.Addr)
	}
	return s, nil
}
