// SPDX-License-Identifier: Apache-2.0
// stockpeer's own pieces: the CN checks, the published map, socket naming and the logical-port
// rule, the command line, and one connection through a target and a source in this process
// (plain and TLS, both copy modes), with a refused client name.

package main

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

type testCert struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte
}

var serial int64 = 1

func makeCert(t *testing.T, cn string, usages []x509.ExtKeyUsage, parent *testCert) *testCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usages}
	signer, signerKey := tmpl, key
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	} else {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCert{cert: c, key: key, der: der}
}

// write puts NAME.crt and NAME.key into dir; their paths.
func (c *testCert) write(t *testing.T, dir, name string) (string, string) {
	t.Helper()
	crt, key := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	kb, err := x509.MarshalECPrivateKey(c.key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(crt, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return crt, key
}

var (
	clientAuth = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	serverAuth = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
)

func TestVerifyPeerCert(t *testing.T) {
	ca := makeCert(t, "kubevirt.io@1", nil, nil)
	other := makeCert(t, "other-ca", nil, nil)
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	cases := []struct {
		name  string
		c     *testCert
		usage x509.ExtKeyUsage
		cns   []string
		want  string // "" = accepted, else a part of the error
	}{
		{"client:migration", makeCert(t, defaultClientCNs[0], clientAuth, ca), x509.ExtKeyUsageClientAuth, defaultClientCNs, ""},
		{"client:virt-handler", makeCert(t, defaultClientCNs[1], clientAuth, ca), x509.ExtKeyUsageClientAuth, defaultClientCNs, ""},
		{"v1.6 target, v1.7 source", makeCert(t, defaultClientCNs[0], clientAuth, ca), x509.ExtKeyUsageClientAuth, defaultClientCNs[1:], "common name is invalid"},
		{"node name as client", makeCert(t, defaultServerCN, append(serverAuth, clientAuth...), ca), x509.ExtKeyUsageClientAuth, defaultClientCNs, "common name is invalid"},
		{"serverAuth-only client", makeCert(t, defaultClientCNs[0], serverAuth, ca), x509.ExtKeyUsageClientAuth, defaultClientCNs, "could not verify"},
		{"other CA", makeCert(t, defaultClientCNs[0], clientAuth, other), x509.ExtKeyUsageClientAuth, defaultClientCNs, "could not verify"},
		{"server", makeCert(t, defaultServerCN, serverAuth, ca), x509.ExtKeyUsageServerAuth, []string{defaultServerCN}, ""},
		{"server, other node name", makeCert(t, "kubevirt.io:system:node:somebody-else", serverAuth, ca), x509.ExtKeyUsageServerAuth, []string{defaultServerCN}, "common name is invalid"},
		{"clientAuth-only server", makeCert(t, defaultServerCN, clientAuth, ca), x509.ExtKeyUsageServerAuth, []string{defaultServerCN}, "could not verify"},
	}
	for _, c := range cases {
		err := verifyPeerCert([][]byte{c.c.der}, pool, c.usage, c.cns)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: got %v, want an error with %q", c.name, err, c.want)
		}
	}
	if err := verifyPeerCert(nil, pool, x509.ExtKeyUsageClientAuth, defaultClientCNs); err == nil {
		t.Error("no certificate: accepted")
	}
}

func TestTargetInfoMarshal(t *testing.T) {
	got := targetInfo{Address: "198.18.0.2", Ports: map[string]int{"41068": 49152, "35001": 0,
		"38284": 49153}}.marshal()
	want := `{"targetNodeAddress":"198.18.0.2","targetDirectMigrationNodePorts":{"35001":0,"38284":49153,"41068":49152}}`
	if got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
	addr, entries, err := parseTargetJSON(`{"targetNodeAddress":"[fd00::2]","key":"x","tls":true,` +
		`"targetDirectMigrationNodePorts":{"41068":49152,"35001":0}}`)
	if err != nil || addr != "fd00::2" || len(entries) != 2 || entries[0] != (sourceEntry{"35001", 0}) ||
		entries[1] != (sourceEntry{"41068", 49152}) {
		t.Errorf("parseTargetJSON: %q %v %v", addr, entries, err)
	}
	for _, bad := range []string{`{}`, `{"targetNodeAddress":"a"}`, `[]`,
		`{"targetNodeAddress":"a","targetDirectMigrationNodePorts":{"x":49152}}`,
		`{"targetNodeAddress":"a","targetDirectMigrationNodePorts":{"70000":49152}}`,
		`{"targetNodeAddress":"a","targetDirectMigrationNodePorts":{"1":-1}}`} {
		if _, _, err := parseTargetJSON(bad); err == nil {
			t.Errorf("parseTargetJSON(%s) accepted", bad)
		}
	}
}

func TestSocketNaming(t *testing.T) {
	uid := "1c0f4b6e-7d4d-4f7e-9a55-6a3c2a8b9f10"
	for logical, want := range map[int]string{
		0:     "/b/migrationproxy/" + uid + "-source.sock",
		49152: "/b/migrationproxy/" + uid + "-49152-source.sock",
		49153: "/b/migrationproxy/" + uid + "-49153-source.sock",
	} {
		if got := sourceSocketPath("/b", uid, logical); got != want {
			t.Errorf("%d: %s, want %s", logical, got, want)
		}
		// The target's rule finds the logical port again from the same name.
		if got := logicalPortOf(uid, sourceSocketPath("/proc/1/root/var/run/kubevirt", uid, logical)); got != logical {
			t.Errorf("logicalPortOf(%d's path) = %d", logical, got)
		}
	}
	if got := logicalPortOf(uid, "/proc/7/root/var/run/libvirt/virtqemud-sock"); got != 0 {
		t.Errorf("virtqemud: %d", got)
	}
}

func TestParseArgs(t *testing.T) {
	o, err := parseArgs("target", []string{"--key", "K", "--socket", "49152=/d/a.sock", "--tls",
		"--cert", "c", "--key", "k", "--ca", "a", "--client-cn", "x, y", "--min-tls", "1.3"})
	if err != nil || o.key != "K" || o.tlsKey != "k" || len(o.sockets) != 1 ||
		o.sockets[0] != (socketArg{49152, "/d/a.sock"}) || len(o.clientCNs) != 2 || o.minTLS != tls.VersionTLS13 {
		t.Fatalf("target: %+v %v", o, err)
	}
	// The migration key after the TLS options, and a path-only --socket (KubeVirt's rule).
	o, err = parseArgs("target", []string{"--tls", "--cert=c", "--key=k", "--ca", "a", "--key", "K",
		"--socket", "/d/K-49153-source.sock", "--socket", "/run/virtqemud-sock"})
	if err != nil || o.key != "K" || o.tlsKey != "k" || o.sockets[0].logical != 49153 || o.sockets[1].logical != 0 {
		t.Fatalf("key after --tls: %+v %v", o, err)
	}
	// --tls-key makes every --key the migration's.
	o, err = parseArgs("source", []string{"--tls", "--key", "K", "--tls-key", "k", "--cert", "c",
		"--ca", "a", "--target", "{}", "--dir", "/d", "--socket-owner", "0:0"})
	if err != nil || o.key != "K" || o.tlsKey != "k" || o.uid != 0 || o.gid != 0 || o.serverCN != defaultServerCN {
		t.Fatalf("--tls-key: %+v %v", o, err)
	}
	o, err = parseArgs("source", []string{"--key", "K", "--target", "{}", "--dir", "/d"})
	if err != nil || o.uid != 107 || o.gid != 107 || o.copyMode != copyGo126 {
		t.Fatalf("defaults: %+v %v", o, err)
	}
	for _, bad := range [][]string{
		{"--socket", "49152=/a"}, // no key
		{"--key", "K"},           // no socket
		{"--key", "K", "--key", "L", "--socket", "/a"},  // two keys
		{"--key", "K", "--socket", "49152=/a", "--tls"}, // TLS without files
		{"--key", "K", "--socket", "49152=/a", "--cert", "c"},
		{"--key", "K", "--socket", "49152=/a", "--min-tls", "1.1"},
		{"--key", "K", "--socket", "49152=/a", "--bogus", "1"},
		{"--key", "K", "--socket", "49152=/a", "--copy", "fast"},
		{"--key", "K", "--socket", "70000=/a"},
	} {
		if _, err := parseArgs("target", bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	if _, err := parseArgs("source", []string{"--key", "K", "--dir", "/d"}); err == nil {
		t.Error("source without --target accepted")
	}
	if _, err := parseArgs("source", []string{"--key", "K", "--target", "{}", "--dir", "/d",
		"--socket-owner", "qemu"}); err == nil {
		t.Error("a user name as --socket-owner accepted")
	}
}

// syncBuffer is a log sink the test reads while the peers write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type pkiFiles struct {
	ca, node, nodeKey, client, clientKey, rogue, rogueKey string
}

func makePKI(t *testing.T, dir string) pkiFiles {
	ca := makeCert(t, "kubevirt.io@1", nil, nil)
	var f pkiFiles
	f.ca, _ = ca.write(t, dir, "ca")
	f.node, f.nodeKey = makeCert(t, defaultServerCN, append(serverAuth, clientAuth...), ca).write(t, dir, "node")
	f.client, f.clientKey = makeCert(t, defaultClientCNs[0], clientAuth, ca).write(t, dir, "client")
	// The node's own pair as a client: right CA, EKU allows clientAuth, but a node's name.
	f.rogue, f.rogueKey = f.node, f.nodeKey
	return f
}

// destination stands where the destination QEMU or NBD server would: it speaks first (as NBD
// does), then reads SIZE bytes, answers their sha256 and closes.
func destination(t *testing.T, path string, size int) (net.Listener, chan error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			errs <- err
			return
		}
		defer c.Close()
		if _, err := c.Write([]byte("HELLO\n")); err != nil {
			errs <- err
			return
		}
		h := sha256.New()
		if _, err := io.CopyN(h, c, int64(size)); err != nil {
			errs <- err
			return
		}
		_, err = c.Write(h.Sum(nil))
		errs <- err
	}()
	return ln, errs
}

func startPeers(t *testing.T, dir string, tlsOn bool, copyMode string, clientCert, clientKey string,
	f pkiFiles) (*target, *source, *syncBuffer, *syncBuffer) {
	t.Helper()
	tlog, slog := &syncBuffer{}, &syncBuffer{}
	targs := []string{"--key", "K", "--socket", "49152=" + filepath.Join(dir, "dst.sock"),
		"--listen-host", "127.0.0.1", "--copy", copyMode}
	if tlsOn {
		targs = append(targs, "--tls", "--cert", f.node, "--key", f.nodeKey, "--ca", f.ca)
	}
	to, err := parseArgs("target", targs)
	if err != nil {
		t.Fatal(err)
	}
	tg, err := newTarget(to, newPeer("target", "K", copyMode, log.New(tlog, "", 0)))
	if err != nil {
		t.Fatal(err)
	}
	tg.serve()
	sargs := []string{"--key", "K", "--target", tg.info.marshal(), "--dir", dir, "--socket-owner",
		strings.Join([]string{strconv.Itoa(os.Getuid()), strconv.Itoa(os.Getgid())}, ":"), "--copy", copyMode}
	if tlsOn {
		sargs = append(sargs, "--tls", "--cert", clientCert, "--key", clientKey, "--ca", f.ca)
	}
	so, err := parseArgs("source", sargs)
	if err != nil {
		t.Fatal(err)
	}
	src, err := newSource(so, newPeer("source", "K", copyMode, log.New(slog, "", 0)))
	if err != nil {
		tg.stopListening()
		t.Fatal(err)
	}
	src.serve()
	return tg, src, tlog, slog
}

func TestThroughPeers(t *testing.T) {
	const size = 3<<20 + 123
	payload := make([]byte, size)
	if _, err := rand.Read(payload); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(payload)
	for _, tc := range []struct {
		name     string
		tls      bool
		copyMode string
	}{{"plain go1.26", false, copyGo126}, {"plain go1.19", false, copyGo119},
		{"tls", true, copyGo126}} {
		t.Run(tc.name, func(t *testing.T) {
			dir, err := os.MkdirTemp("", "sp")
			if err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(dir)
			f := makePKI(t, dir)
			dst, errs := destination(t, filepath.Join(dir, "dst.sock"), size)
			defer dst.Close()
			tg, src, tlog, slog := startPeers(t, dir, tc.tls, tc.copyMode, f.client, f.clientKey, f)
			defer func() { tg.stopListening(); tg.shutdown() }()
			defer func() { src.stopListening(); src.shutdown() }()
			if p := src.paths(); len(p) != 1 || p[0] != filepath.Join(dir, "migrationproxy", "K-49152-source.sock") {
				t.Fatalf("source sockets %v", p)
			}
			c, err := net.Dial("unix", src.paths()[0])
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			r := bufio.NewReader(c)
			if line, err := r.ReadString('\n'); err != nil || line != "HELLO\n" {
				t.Fatalf("greeting %q %v", line, err)
			}
			if _, err := c.Write(payload); err != nil {
				t.Fatal(err)
			}
			sum := make([]byte, 32)
			if _, err := io.ReadFull(r, sum); err != nil || !bytes.Equal(sum, want[:]) {
				t.Fatalf("digest %x %v", sum, err)
			}
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
			// The destination closed: the target ends the pair, the source sees the TCP end and
			// its unix client gets EOF.
			if n, err := r.Read(make([]byte, 1)); n != 0 || err != io.EOF {
				t.Fatalf("after the destination closed: %d %v", n, err)
			}
			waitFor(t, "both lines", func() bool {
				return strings.Contains(tlog.String(), " ended_by=") && strings.Contains(slog.String(), " ended_by=")
			})
			tl, sl := tlog.String(), slog.String()
			if !strings.Contains(tl, "ended_by=local_to_peer") || !strings.Contains(tl, "peer_to_local="+strconv.Itoa(size)+" ") {
				t.Errorf("target line: %s", tl)
			}
			if !strings.Contains(sl, "ended_by=peer_to_local") || !strings.Contains(sl, "local_to_peer="+strconv.Itoa(size)+" ") {
				t.Errorf("source line: %s", sl)
			}
			if tc.tls && (!strings.Contains(tl, `peer="kubevirt.io:system:client:migration"`) ||
				!strings.Contains(sl, `peer="kubevirt.io:system:node:virt-handler"`)) {
				t.Errorf("TLS peers: %s %s", tl, sl)
			}
		})
	}
}

func TestRefusedClientName(t *testing.T) {
	dir, err := os.MkdirTemp("", "sp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	f := makePKI(t, dir)
	dst, _ := destination(t, filepath.Join(dir, "dst.sock"), 1)
	defer dst.Close()
	tg, src, tlog, _ := startPeers(t, dir, true, copyGo126, f.rogue, f.rogueKey, f)
	defer func() { tg.stopListening(); tg.shutdown() }()
	defer func() { src.stopListening(); src.shutdown() }()
	c, err := net.Dial("unix", src.paths()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	// Under TLS 1.3 the source's handshake completes before the target judges its certificate:
	// the refusal arrives as an alert on the first read, the source ends the pair, the client
	// gets EOF and never the destination's greeting. ECONNRESET instead of EOF when the source
	// closed before reading the "x": Linux resets a unix stream closed with unread data.
	c.Write([]byte("x"))
	got, err := io.ReadAll(c)
	if len(got) != 0 || (err != nil && !errors.Is(err, syscall.ECONNRESET)) {
		t.Fatalf("read %q %v, want EOF (or a reset) and nothing", got, err)
	}
	waitFor(t, "the target's line", func() bool { return strings.Contains(tlog.String(), "ended_by=") })
	if !strings.Contains(tlog.String(), "common name is invalid") {
		t.Errorf("target line: %s", tlog.String())
	}
}
