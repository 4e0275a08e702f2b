package natstest

import (
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// readyTimeout bounds how long Start and Restart wait for the server.
const readyTimeout = 10 * time.Second

// Server is an in-process nats-server with JetStream and a file store.
// It is safe for concurrent use.
type Server struct {
	t        testing.TB // nil for a server from New, which has no Restart
	storeDir string
	core     bool // no JetStream

	mu   sync.Mutex // guards srv and port
	srv  *server.Server
	port int
}

// Start runs a server on 127.0.0.1 with a random port and a store in
// t.TempDir(), and shuts it down in t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, storeDir: t.TempDir(), port: -1}
	if err := s.start(); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// StartCore runs a server without JetStream (core NATS only).
func StartCore(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, storeDir: t.TempDir(), port: -1, core: true}
	if err := s.start(); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// New starts a server as Start does, for a program rather than a test (the
// examples, the demo's broker child): its store is a new temporary
// directory, which stop removes after shutting the server down. stop is
// idempotent.
func New() (url string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "natstest-")
	if err != nil {
		return "", nil, fmt.Errorf("natstest: %w", err)
	}
	s := &Server{storeDir: dir, port: -1}
	if err := s.start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("natstest: %w", err)
	}
	return s.URL(), func() {
		s.Shutdown()
		os.RemoveAll(dir)
	}, nil
}

// NewJetStream starts a server as New does and connects to it, for a
// program that wants a JetStream context rather than a URL (the examples).
// stop closes the connection and stops the server.
func NewJetStream() (nc *nats.Conn, js jetstream.JetStream, stop func(), err error) {
	url, stopServer, err := New()
	if err != nil {
		return nil, nil, nil, err
	}
	if nc, err = nats.Connect(url); err == nil {
		js, err = jetstream.New(nc)
		if err != nil {
			nc.Close()
		}
	}
	if err != nil {
		stopServer()
		return nil, nil, nil, fmt.Errorf("natstest: connect: %w", err)
	}
	return nc, js, func() {
		nc.Close()
		stopServer()
	}, nil
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	srv, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      s.port,
		JetStream: !s.core,
		StoreDir:  s.storeDir,
		NoLog:     true,
		NoSigs:    true,
		// Small limits keep a test run's memory and disk use modest.
		JetStreamMaxMemory: 64 << 20,
		JetStreamMaxStore:  1 << 30,
	})
	if err != nil {
		return fmt.Errorf("new server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(readyTimeout) {
		srv.Shutdown()
		return fmt.Errorf("server not ready after %v", readyTimeout)
	}
	s.srv = srv
	s.port = srv.Addr().(*net.TCPAddr).Port
	return nil
}

// URL is the client URL, stable across Restart.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("nats://127.0.0.1:%d", s.port)
}

// Restart stops the server and starts a new one on the same port and store
// directory. Connected clients see a disconnect and reconnect.
func (s *Server) Restart() {
	s.t.Helper()
	s.Shutdown()
	if err := s.start(); err != nil {
		s.t.Fatalf("natstest: restart: %v", err)
	}
}

// Shutdown stops the server and waits until it is down. Safe to call twice.
func (s *Server) Shutdown() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// Connect opens a client connection that keeps reconnecting (for restart
// tests) and is closed in t.Cleanup.
func (s *Server) Connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.URL(),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectBufSize(-1), // fail publishes while down instead of buffering
	)
	if err != nil {
		t.Fatalf("natstest: connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream connects and returns a JetStream context.
func (s *Server) JetStream(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc := s.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	return nc, js
}
