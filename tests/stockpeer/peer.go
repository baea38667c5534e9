// SPDX-License-Identifier: Apache-2.0
// One connection pair as handleConnection does it: two copies, the pair ends at the first copy
// to finish (or at stop) and closes one side only (the source its unix side, the target its
// TCP/TLS side); the other side is left to the peer, the garbage collector or exit. Also the one
// log line per connection, written when the pair has ended.

package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// peer is what the target and source roles share: the stop channel, the connection count, the
// log and the copy mode.
type peer struct {
	role     string
	key      string
	copyMode string
	log      *log.Logger
	stop     chan struct{} // closed at SIGTERM: pairs in flight end as at their first EOF
	seq      atomic.Uint64
	pairs    sync.WaitGroup
	stopOnce sync.Once
}

func newPeer(role, key, copyMode string, logger *log.Logger) *peer {
	return &peer{role: role, key: key, copyMode: copyMode, log: logger, stop: make(chan struct{})}
}

// shutdown ends the pairs in flight (each closes its side and writes its line at once). The
// accept loops must have ended (stopListening): each counted its connections in pairs.
func (p *peer) shutdown() {
	p.stopOnce.Do(func() { close(p.stop) })
	p.pairs.Wait()
}

// How long a pair that has ended waits for its other copy before it writes its line. Once one
// side is closed the other copy cannot deliver another byte (its next write, or read, fails), so
// it ends at once or it blocks on a read that nothing answers (a destination that never speaks
// and never closes): either way the line's counts are final.
const otherCopyWait = 100 * time.Millisecond

type copyResult struct {
	n   int64
	err error
	at  time.Duration
}

// direction is one copy of a pair: its live byte count (when it can be counted without taking
// io.Copy's fast path away) and its result once it returned.
type direction struct {
	n    atomic.Int64
	live bool
	res  *copyResult
}

func (d *direction) bytes() int64 {
	switch {
	case d.res != nil:
		return d.res.n
	case d.live:
		return d.n.Load()
	}
	return -1
}

func (d *direction) end() string {
	switch {
	case d.res == nil:
		return "open"
	case d.res.err == nil:
		return "eof"
	}
	return strconv.Quote(d.res.err.Error())
}

// conn is one accepted connection and what was dialled for it.
type conn struct {
	id       uint64
	logical  int
	accepted string // where it came from
	dialled  string // what was dialled for it
	peerSide net.Conn
	local    net.Conn // the unix side
	started  time.Time
	toPeer   direction
	toLocal  direction
}

func (p *peer) newConn(logical int, accepted, dialled string) *conn {
	return &conn{id: p.seq.Add(1), logical: logical, accepted: accepted, dialled: dialled,
		started: time.Now()}
}

func (p *peer) prefix(c *conn) string {
	return fmt.Sprintf("conn %d role=%s key=%s port=%d accepted=%s dialled=%s", c.id, p.role,
		p.key, c.logical, c.accepted, c.dialled)
}

// dialFailed logs a connection whose far side could not be opened (its accepted side is closed
// by the caller, as a stock proxy does: no handshake, no alert).
func (p *peer) dialFailed(c *conn, err error) {
	p.log.Printf("%s secs=%.3f dial_error=%s", p.prefix(c), time.Since(c.started).Seconds(),
		strconv.Quote(err.Error()))
}

// run copies both ways until the first copy ends or stop, then closes closeSide (and only it),
// and writes the connection's line.
func (p *peer) run(c *conn, closeSide net.Conn) {
	toPeer := make(chan copyResult, 1)
	toLocal := make(chan copyResult, 1)
	go func() {
		n, err := p.copyConns(c.peerSide, c.local, &c.toPeer)
		toPeer <- copyResult{n, err, time.Since(c.started)}
	}()
	go func() {
		n, err := p.copyConns(c.local, c.peerSide, &c.toLocal)
		toLocal <- copyResult{n, err, time.Since(c.started)}
	}()
	endedBy := "stop"
	var endedAt time.Duration
	select {
	case r := <-toPeer:
		c.toPeer.res, endedBy, endedAt = &r, "local_to_peer", r.at
	case r := <-toLocal:
		c.toLocal.res, endedBy, endedAt = &r, "peer_to_local", r.at
	case <-p.stop:
		endedAt = time.Since(c.started)
	}
	closeSide.Close()
	// Only to report the other copy's end: the wire already is as a stock proxy leaves it.
	timer := time.NewTimer(otherCopyWait)
	defer timer.Stop()
	for c.toPeer.res == nil || c.toLocal.res == nil {
		select {
		case r := <-toPeer:
			c.toPeer.res = &r
		case r := <-toLocal:
			c.toLocal.res = &r
		case <-timer.C:
			p.report(c, endedBy, endedAt)
			return
		}
	}
	p.report(c, endedBy, endedAt)
}

func (p *peer) report(c *conn, endedBy string, endedAt time.Duration) {
	var tlsInfo string
	if tc, ok := c.peerSide.(*tls.Conn); ok {
		st := tc.ConnectionState()
		if st.HandshakeComplete {
			cn := ""
			if len(st.PeerCertificates) > 0 {
				cn = st.PeerCertificates[0].Subject.CommonName
			}
			tlsInfo = fmt.Sprintf(" tls=%s cipher=%s peer=%s", tlsVersionName(st.Version),
				tls.CipherSuiteName(st.CipherSuite), strconv.Quote(cn))
		} else {
			tlsInfo = " tls=none"
		}
	}
	var errText string
	for _, d := range []*direction{&c.toPeer, &c.toLocal} {
		if d.res != nil && d.res.err != nil && !errors.Is(d.res.err, net.ErrClosed) {
			errText = " error=" + strconv.Quote(d.res.err.Error())
			break
		}
	}
	p.log.Printf("%s%s ended_by=%s secs=%.3f local_to_peer=%d local_to_peer_end=%s "+
		"peer_to_local=%d peer_to_local_end=%s%s", p.prefix(c), tlsInfo, endedBy,
		endedAt.Seconds(), c.toPeer.bytes(), c.toPeer.end(), c.toLocal.bytes(), c.toLocal.end(),
		errText)
}

// countingWriter counts what a generic io.Copy writes (it has no ReadFrom, and the copies it is
// used for have no fast path to lose).
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// copyConns is io.Copy(dst, src) as the Go KubeVirt builds with runs it: with --copy go1.26,
// plain TCP to unix and unix to TCP go through splice(2) (TCPConn.WriteTo since Go 1.22,
// TCPConn.ReadFrom, both through a 1 MiB pipe); with go1.19 this toolchain's io.Copy decides
// (unix to TCP spliced by TCPConn.ReadFrom, not counted until it returns). TLS connections are
// always io.Copy's 32 KiB buffer (tls.Conn has neither ReadFrom nor WriteTo).
func (p *peer) copyConns(dst, src net.Conn, d *direction) (int64, error) {
	tcpDst, dstIsTCP := dst.(*net.TCPConn)
	unixDst, dstIsUnix := dst.(*net.UnixConn)
	_, srcIsTCP := src.(*net.TCPConn)
	_, srcIsUnix := src.(*net.UnixConn)
	if p.copyMode == copyGo126 {
		d.live = true
		switch {
		case srcIsTCP && dstIsUnix:
			return spliceConns(unixDst, src.(*net.TCPConn), &d.n)
		case srcIsUnix && dstIsTCP:
			return spliceConns(tcpDst, src.(*net.UnixConn), &d.n)
		}
	} else if srcIsUnix && dstIsTCP {
		return io.Copy(dst, src) // TCPConn.ReadFrom: splice, the fast path kept
	}
	d.live = true
	return io.Copy(countingWriter{dst, &d.n}, src)
}
