// SPDX-License-Identifier: Apache-2.0
// kvpeer's own pieces: the added options, the log lines' form, KubeVirt's TLS checks from files,
// and one connection through a target and a source of KubeVirt's code in-process.

package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kubevirt.io/client-go/log"
	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
)

func TestTakeOldClient(t *testing.T) {
	rest, cert, key, err := takeOldClient([]string{"--key", "k", "--old-client-cert", "c",
		"--tls", "--old-client-key", "o"})
	if err != nil || cert != "c" || key != "o" || strings.Join(rest, " ") != "--key k --tls" {
		t.Fatalf("got %q %q %q %v", rest, cert, key, err)
	}
	if _, _, _, err := takeOldClient([]string{"--old-client-cert", "c"}); err == nil {
		t.Fatal("a certificate without its key was taken")
	}
}

func TestLogLine(t *testing.T) {
	var buf bytes.Buffer
	log.Out = &buf
	defer func() { log.Out = os.Stderr }()
	l := log.Log.With("uid", "k", "outbound", "x.sock")
	l.Reason(errors.New("boom")).Infof("%d bytes copied from inbound to outbound", 5)
	l.V(3).Infof("not shown")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines: %q", len(lines), buf.String())
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatal(err)
	}
	if m["msg"] != "5 bytes copied from inbound to outbound" || m["uid"] != "k" ||
		m["reason"] != "boom" || m["level"] != "info" || m["component"] != "virt-handler" ||
		!strings.HasPrefix(m["pos"], "kvpeer_test.go:") {
		t.Fatalf("line %s", lines[0])
	}
}

type pki struct{ dir, ca string }

func (p *pki) write(name string, der []byte, key *ecdsa.PrivateKey) (string, string) {
	cert := filepath.Join(p.dir, name+".crt")
	os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	if key == nil {
		return cert, ""
	}
	kd, _ := x509.MarshalECPrivateKey(key)
	kf := filepath.Join(p.dir, name+".key")
	os.WriteFile(kf, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), 0o600)
	return cert, kf
}

// makePKI: a CA and leaves signed by it: node (server and client), client:migration (client).
func makePKI(t *testing.T) (*pki, map[string][2]string) {
	p := &pki{dir: t.TempDir()}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	p.ca, _ = p.write("ca", caDER, nil)
	out := map[string][2]string{}
	for i, leaf := range []struct {
		name, cn string
		usage    []x509.ExtKeyUsage
	}{
		{"node", "kubevirt.io:system:node:virt-handler",
			[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}},
		{"client", "kubevirt.io:system:client:migration",
			[]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
	} {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)),
			Subject: pkix.Name{CommonName: leaf.cn}, NotBefore: time.Now().Add(-time.Hour),
			NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: leaf.usage,
			KeyUsage: x509.KeyUsageDigitalSignature}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		c, k := p.write(leaf.name, der, key)
		out[leaf.name] = [2]string{c, k}
	}
	return p, out
}

// handshake runs one handshake over loopback TCP; the client's and the server's errors.
func handshake(client, server *tls.Config) (error, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err, err
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		b, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer b.Close()
		b.SetDeadline(time.Now().Add(10 * time.Second))
		s := tls.Server(b, server)
		err = s.Handshake()
		if err == nil {
			_, err = s.Read(make([]byte, 1)) // TLS 1.3: the client's certificate comes late
		}
		done <- err
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return err, err
	}
	defer a.Close()
	a.SetDeadline(time.Now().Add(10 * time.Second))
	c := tls.Client(a, client)
	err = c.Handshake()
	if err == nil {
		_, err = c.Write([]byte{1})
	}
	return err, <-done
}

func TestTLSNames(t *testing.T) {
	var buf bytes.Buffer
	log.Out = &buf
	defer func() { log.Out = os.Stderr }()
	p, f := makePKI(t)
	hl := log.Log.With("component", "kvpeer")
	server, err := serverConfig(f["node"][0], f["node"][1], p.ca, defaultClientCNs,
		tls.VersionTLS12, hl)
	if err != nil {
		t.Fatal(err)
	}
	good, _ := clientConfig(f["client"][0], f["client"][1], p.ca, defaultServerCN, "migration", hl)
	if ce, se := handshake(good, server); ce != nil || se != nil {
		t.Fatalf("client:migration to the node: %v / %v", ce, se)
	}
	if !strings.Contains(buf.String(), `"peer":"kubevirt.io:system:client:migration"`) {
		t.Fatalf("no server handshake line naming the client: %s", buf.String())
	}
	nodeAsClient, _ := clientConfig(f["node"][0], f["node"][1], p.ca, defaultServerCN, "migration", hl)
	if _, se := handshake(nodeAsClient, server); se == nil ||
		!strings.Contains(se.Error(), "common name is invalid, got kubevirt.io:system:node:virt-handler") {
		t.Fatalf("the node certificate as a client's: %v", se)
	}
	wrongServer, _ := clientConfig(f["client"][0], f["client"][1], p.ca, "somebody", "migration", hl)
	if ce, _ := handshake(wrongServer, server); ce == nil || !strings.Contains(ce.Error(), "common name is invalid") {
		t.Fatalf("a server name not asked for: %v", ce)
	}
}

// TestOneConnection: a target and a source of KubeVirt's code in-process (plain, disableTLS),
// a logical port given by LOGICAL= against the path, bytes through both.
func TestOneConnection(t *testing.T) {
	dir := t.TempDir()
	dst := filepath.Join(dir, "dst.sock")
	ln, err := net.Listen("unix", dst)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hl := log.Log.With("component", "kvpeer")
	cfg := virtconfig.NewClusterConfig(true)
	to, err := parseArgs("target", []string{"--key", "k1", "--socket", "49152=" + dst,
		"--advertise", "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	tm := newManager(nil, nil, nil, cfg)
	lines, cleanup, err := startTarget(tm, to, hl)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	defer tm.StopTargetListener("k1")
	var info targetInfo
	if err := json.Unmarshal([]byte(lines[0]), &info); err != nil || len(info.Ports) != 1 {
		t.Fatalf("target line %q: %v", lines[0], err)
	}
	for _, logical := range info.Ports {
		if logical != 49152 {
			t.Fatalf("logical port %d in %s", logical, lines[0])
		}
	}
	so, err := parseArgs("source", []string{"--key", "k1", "--target", lines[0], "--dir", dir,
		"--socket-owner", fmt.Sprintf("%d:%d", os.Getuid(), os.Getgid())})
	if err != nil {
		t.Fatal(err)
	}
	sm := newManager(nil, nil, nil, cfg)
	socks, err := startSource(sm, so)
	if err != nil {
		t.Fatal(err)
	}
	defer sm.StopSourceListener("k1")
	if len(socks) != 1 || socks[0] != filepath.Join(dir, "migrationproxy", "k1-49152-source.sock") {
		t.Fatalf("source sockets %q", socks)
	}
	c, err := net.Dial("unix", socks[0])
	if err != nil {
		t.Fatal(err)
	}
	in, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	msg := bytes.Repeat([]byte("kubevirt"), 1<<14)
	go func() { c.Write(msg); c.Close() }()
	got, _ := io.ReadAll(io.LimitReader(in, int64(len(msg))))
	if !bytes.Equal(got, msg) {
		t.Fatalf("%d bytes came through, %d sent", len(got), len(msg))
	}
}
