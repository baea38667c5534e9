// SPDX-License-Identifier: Apache-2.0
// The target role: StartTargetListener and GetTargetListenerPorts for one key. One TCP (or TLS)
// listener per unix path on the wildcard address, port 0; per accepted connection the unix path
// is dialled at once (before the TLS handshake, which Go runs on the first read or write).

package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"sync"
)

type targetListener struct {
	ln      net.Listener
	path    string
	logical int
	port    int
}

type target struct {
	*peer
	listeners []*targetListener
	info      targetInfo
	tls       bool
	wg        sync.WaitGroup
}

// newTarget makes every listener (all or none, as StartTargetListener: one failure stops those
// made) and the map to publish.
func newTarget(o *options, p *peer) (*target, error) {
	var cfg *tls.Config
	if o.tls {
		var err error
		if cfg, err = serverConfig(o.cert, o.tlsKey, o.ca, o.clientCNs, o.minTLS); err != nil {
			return nil, err
		}
	}
	host := o.listenHost
	if host == "" {
		host = zeroAddress()
	}
	addr, err := advertiseAddress(o.advertise, host)
	if err != nil {
		return nil, err
	}
	t := &target{peer: p, tls: cfg != nil,
		info: targetInfo{Address: addr, Ports: map[string]int{}}}
	for _, s := range o.sockets {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.closeListeners()
			return nil, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		if cfg != nil {
			ln = tls.NewListener(ln, cfg)
		}
		t.listeners = append(t.listeners, &targetListener{ln: ln, path: s.path,
			logical: s.logical, port: port})
		t.info.Ports[strconv.Itoa(port)] = s.logical
	}
	return t, nil
}

func (t *target) describe() []string {
	var out []string
	for _, l := range t.listeners {
		out = append(out, fmt.Sprintf("port %d listening on %s tls=%v -> %s", l.logical,
			l.ln.Addr(), t.tls, l.path))
	}
	return out
}

// serve starts the accept loops. An Accept error ends that loop (logged unless stopping).
func (t *target) serve() {
	for _, l := range t.listeners {
		l := l
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			for {
				c, err := l.ln.Accept()
				if err != nil {
					select {
					case <-t.stop:
					default:
						t.log.Printf("port %d: accept: %v; no more connections on it", l.logical, err)
					}
					return
				}
				t.pairs.Add(1) // here, before stop's Wait can begin
				go t.handle(c, l)
			}
		}()
	}
}

func (t *target) handle(accepted net.Conn, l *targetListener) {
	defer t.pairs.Done()
	c := t.newConn(l.logical, accepted.RemoteAddr().String(), l.path)
	u, err := net.Dial("unix", l.path)
	if err != nil {
		t.dialFailed(c, err)
		accepted.Close()
		return
	}
	c.peerSide, c.local = accepted, u
	t.run(c, accepted) // the target closes the TCP/TLS side only
}

func (t *target) closeListeners() {
	for _, l := range t.listeners {
		l.ln.Close()
	}
}

// stopListening is StopTargetListener: the listeners closed, the accept loops ended.
func (t *target) stopListening() {
	t.stopOnce.Do(func() { close(t.stop) })
	t.closeListeners()
	t.wg.Wait()
}
