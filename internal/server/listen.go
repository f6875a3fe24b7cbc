package server

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// reservedFiles are the open files Listener leaves to everything but client connections: the
// database, its listener connection, logs.
const reservedFiles = 256

// overflowTimeout bounds the time a connection past MaxConns may take to send its request line
// and headers, and to go away after its answer.
const overflowTimeout = time.Second

// Answers given to connections past MaxConns, without reaching the handler.
var (
	overflowHealthy = overflowAnswer("200 OK", "text/plain", "ok\n")
	overflowBusy    = overflowAnswer("503 Service Unavailable", "application/json",
		`{"code":"UNAVAILABLE","message":"the server is at its connection limit; retry"}`+"\n")
)

func overflowAnswer(status, contentType, body string) []byte {
	return fmt.Appendf(nil, "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s",
		status, contentType, len(body), body)
}

// HTTPServer returns the http.Server that serves s: headers within Config.HeaderTimeout and
// MaxHeaderBytes, keep-alive connections idle at most Config.IdleTimeout, and live streams ended
// when Shutdown starts. It sets no ReadTimeout, since each request's body has its own deadline
// (ServeHTTP), and no WriteTimeout, which would cut the live streams (they bound each write
// instead). Serve it on Listener(ln).
func (s *Server) HTTPServer() *http.Server {
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: s.cfg.HeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelWarn),
		ConnState:         s.conns.state,
		ConnContext:       withConn,
	}
	hs.RegisterOnShutdown(s.CloseStreams)
	return hs
}

// Listener wraps ln so that at most Config.MaxConns connections reach the server at once. A new
// connection past a client address's share of unauthenticated connections, or past the cap,
// takes the place of an idle one (see connTable). When there is none, Config.ConnHeadroom more
// are accepted and answered without the handler, each within about a second: GET /healthz
// with ok (the process is alive), anything else with 503 and Retry-After. Connections past both
// are closed as soon as they are accepted, so they neither queue in the kernel nor hold file
// descriptors. Both numbers are lowered to fit the process's open-file limit (which the Go
// runtime raises to the hard limit at start on Unix).
func (s *Server) Listener(ln net.Listener) net.Listener {
	served, headroom := s.cfg.MaxConns, s.cfg.ConnHeadroom
	if limit := openFileLimit(); limit > 0 && served+headroom > limit-reservedFiles {
		avail := max(limit-reservedFiles, 2)
		served = max(avail*served/(served+headroom), 1)
		headroom = max(avail-served, 1)
		s.cfg.Logger.Warn("connection limits lowered to fit the open-file limit", "open_file_limit", limit,
			"max_conns", served, "headroom", headroom)
	}
	return &capListener{Listener: ln, m: s.metrics, table: s.conns,
		served: make(chan struct{}, served), headroom: make(chan struct{}, headroom)}
}

// capListener is the listener Listener returns.
type capListener struct {
	net.Listener
	m                *serverMetrics
	table            *connTable
	served, headroom chan struct{} // semaphores
}

// Accept returns the next connection that fits under the cap, answering the others itself.
func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := connKey(c)
		// A closed connection gives its slot back before Close returns, so one eviction makes
		// room for one connection.
		admit := !l.table.full(key) || l.evicted(key)
		if admit && (l.take() || (l.evicted("") && l.take())) {
			cc := &capConn{Conn: c, key: key, table: l.table, release: func() { l.m.conns.Dec(); <-l.served }}
			l.m.conns.Inc()
			l.table.add(cc)
			return cc, nil
		}
		select {
		case l.headroom <- struct{}{}:
			go func() {
				l.m.overflow.WithLabelValues(answerOverflow(c)).Inc()
				<-l.headroom
			}()
		default:
			l.m.overflow.WithLabelValues("dropped").Inc()
			_ = c.Close()
		}
	}
}

// take takes a served slot if one is free.
func (l *capListener) take() bool {
	select {
	case l.served <- struct{}{}:
		return true
	default:
		return false
	}
}

// evicted closes the oldest idle connection (of key's unauthenticated ones, when key is not
// empty) and counts it; false when there is none.
func (l *capListener) evicted(key string) bool {
	if !l.table.evict(key) {
		return false
	}
	reason := "cap"
	if key != "" {
		reason = "address"
	}
	l.m.evicted.WithLabelValues(reason).Inc()
	return true
}

// answerOverflow answers one connection past the cap and closes it; it returns what it did.
func answerOverflow(c net.Conn) string {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(overflowTimeout))
	br := bufio.NewReaderSize(c, 1024)
	line, err := br.ReadSlice('\n')
	healthz := err == nil && bytes.HasPrefix(line, []byte("GET /healthz "))
	// Read the rest of the head, so that closing does not reset the connection under the answer.
	for i := 0; err == nil && i < 64 && len(bytes.TrimSpace(line)) > 0; i++ {
		line, err = br.ReadSlice('\n')
	}
	answer, outcome := overflowBusy, "busy"
	if healthz {
		answer, outcome = overflowHealthy, "healthz"
	}
	if _, err := c.Write(answer); err != nil {
		return "lost"
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	}
	return outcome
}

// capConn gives its slot back when closed.
type capConn struct {
	net.Conn
	once    sync.Once
	release func()
	key     string // the client address it counts against
	table   *connTable

	// Guarded by table.mu.
	authed    bool      // a request of it carried valid credentials
	idleSince time.Time // zero while a request is in progress
}

// Close closes the connection and frees its slot.
func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.table.remove(c)
		c.release()
	})
	return err
}

// CloseWrite lets http.Server half-close the connection before closing it, as it does with a
// bare TCP connection.
func (c *capConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
