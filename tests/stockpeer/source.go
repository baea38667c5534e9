// SPDX-License-Identifier: Apache-2.0
// The source role: StartSourceListener for one key. One unix listener per entry of the target's
// map at KubeVirt's socket name, chowned to the QEMU user; per accepted connection a tls.Dial
// (or net.Dial) to the target's address and that entry's TCP port, no timeout, no retry.

package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
)

type sourceListener struct {
	ln      net.Listener
	path    string
	logical int
	target  string // host:port dialled
}

type source struct {
	*peer
	listeners []*sourceListener
	cfg       *tls.Config
	wg        sync.WaitGroup
}

func newSource(o *options, p *peer) (*source, error) {
	addr, entries, err := parseTargetJSON(o.target)
	if err != nil {
		return nil, err
	}
	s := &source{peer: p}
	if o.tls {
		if s.cfg, err = clientConfig(o.cert, o.tlsKey, o.ca, o.serverCN); err != nil {
			return nil, err
		}
	}
	seen := map[string]bool{}
	for _, e := range entries {
		path := sourceSocketPath(o.dir, o.key, e.logical)
		if seen[path] {
			// A stock source does the same (the second RemoveAll takes the first's file); said
			// here because it is never what a test means.
			p.log.Printf("warning: two entries for logical port %d: %s is replaced", e.logical, path)
		}
		seen[path] = true
		ln, err := unixListen(path, o.uid, o.gid)
		if err != nil {
			s.closeListeners()
			return nil, err
		}
		s.listeners = append(s.listeners, &sourceListener{ln: ln, path: path,
			logical: e.logical, target: net.JoinHostPort(addr, e.tcpPort)})
	}
	return s, nil
}

// unixListen is createUnixListener: remove what is there, make the directory (0755), listen,
// chown the socket to the QEMU user (no chmod: the umask decides its mode, as in KubeVirt).
func unixListen(path string, uid, gid int) (net.Listener, error) {
	if err := os.RemoveAll(path); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chown(path, uid, gid); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chown %s to %d:%d: %v", path, uid, gid, err)
	}
	return ln, nil
}

func (s *source) paths() []string {
	var out []string
	for _, l := range s.listeners {
		out = append(out, l.path)
	}
	return out
}

func (s *source) describe() []string {
	var out []string
	for _, l := range s.listeners {
		out = append(out, fmt.Sprintf("port %d listening on %s tls=%v -> %s", l.logical, l.path,
			s.cfg != nil, l.target))
	}
	return out
}

func (s *source) serve() {
	for _, l := range s.listeners {
		l := l
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				c, err := l.ln.Accept()
				if err != nil {
					select {
					case <-s.stop:
					default:
						s.log.Printf("port %d: accept: %v; no more connections on it", l.logical, err)
					}
					return
				}
				s.pairs.Add(1) // here, before stop's Wait can begin
				go s.handle(c, l)
			}
		}()
	}
}

func (s *source) handle(accepted net.Conn, l *sourceListener) {
	defer s.pairs.Done()
	c := s.newConn(l.logical, l.path, l.target)
	var out net.Conn
	var err error
	if s.cfg != nil {
		out, err = tls.Dial("tcp", l.target, s.cfg) // the handshake completes inside Dial
	} else {
		out, err = net.Dial("tcp", l.target)
	}
	if err != nil {
		s.dialFailed(c, err)
		accepted.Close()
		return
	}
	c.peerSide, c.local = out, accepted
	s.run(c, accepted) // the source closes its unix side only; the TCP/TLS conn is left open
}

func (s *source) closeListeners() {
	for _, l := range s.listeners {
		l.ln.Close() // a UnixListener unlinks its socket file, as StopSourceListener's RemoveAll
	}
}

func (s *source) stopListening() {
	s.stopOnce.Do(func() { close(s.stop) })
	s.closeListeners()
	s.wg.Wait()
}
