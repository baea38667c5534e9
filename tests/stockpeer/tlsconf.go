// SPDX-License-Identifier: Apache-2.0
// TLS as KubeVirt's pkg/util/tls/tls.go sets it up for the migration proxy: a server that
// requires and verifies a client certificate (CA + clientAuth + CN in a list), a client that
// presents the migration certificate and checks the server (CA + serverAuth + one CN). No
// hostname check, no ALPN, no session cache, no cipher list: Go's defaults otherwise.

package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
)

func loadCAPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	return pool, nil
}

// verifyPeerCert is verifyPeerCert of tls.go (externallyManaged false: no intermediates, CN
// checked): the leaf must chain to pool for usage and carry one of the names in cns.
func verifyPeerCert(rawCerts [][]byte, pool *x509.CertPool, usage x509.ExtKeyUsage,
	cns []string) error {
	if len(rawCerts) == 0 {
		return errors.New("no client certificate provided.")
	}
	c, err := x509.ParseCertificate(rawCerts[0])
	if err != nil {
		return fmt.Errorf("failed to parse peer certificate: %v", err)
	}
	if _, err = c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("could not verify peer certificate: %v", err)
	}
	for _, cn := range cns {
		if c.Subject.CommonName == cn {
			return nil
		}
	}
	return fmt.Errorf("common name is invalid, expected %s, but got %s", strings.Join(cns, " or "),
		c.Subject.CommonName)
}

// serverConfig is the target's (SetupTLSForServer's per-handshake config, built once here: no
// rotation in a test peer). minVersion is the CR's minTLSVersion; CipherSuites stay nil.
func serverConfig(certFile, keyFile, caFile string, clientCNs []string,
	minVersion uint16) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	pool, err := loadCAPool(caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:         minVersion,
		ClientCAs:          pool,
		Certificates:       []tls.Certificate{cert},
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			return verifyPeerCert(raw, pool, x509.ExtKeyUsageClientAuth, clientCNs)
		},
		ClientAuth: tls.RequireAndVerifyClientCert,
	}, nil
}

// clientConfig is the source's (SetupTLSForClients): the migration certificate, and the server
// checked by VerifyPeerCertificate only.
func clientConfig(certFile, keyFile, caFile, serverCN string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	pool, err := loadCAPool(caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &cert, nil
		},
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			return verifyPeerCert(raw, pool, x509.ExtKeyUsageServerAuth, []string{serverCN})
		},
	}, nil
}

func tlsVersionName(v uint16) string {
	switch v {
	case tls.VersionTLS12:
		return "TLSv1.2"
	case tls.VersionTLS13:
		return "TLSv1.3"
	}
	return fmt.Sprintf("0x%04x", v)
}
