// SPDX-License-Identifier: Apache-2.0
// TLS configs as KubeVirt's pkg/util/tls/tls.go makes them for the migration proxy
// (SetupTLSForServer, SetupTLSForClients; externallyManaged false), from fixed files instead of
// certificate managers: the server requires a client certificate from the CA whose CN is one of
// the allowed names, the client presents its pair and accepts only the node name. Each config
// also logs every completed handshake (VerifyConnection, which KubeVirt does not set; it only
// observes): the harness's way to see version, cipher and peer name.

package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"

	"kubevirt.io/client-go/log"
)

func loadPair(certFile, keyFile string) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return &cert, nil
}

func loadPool(caFile string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate", caFile)
	}
	return pool, nil
}

// verifyPeerCert is KubeVirt's, with the allowed names written out in full
// (kubevirt.io:system:client:TYPE for each --migration-cn-types TYPE).
func verifyPeerCert(rawCerts [][]byte, pool *x509.CertPool, usage x509.ExtKeyUsage,
	names []string) error {
	if len(rawCerts) == 0 {
		return fmt.Errorf("no client certificate provided.")
	}
	c, err := x509.ParseCertificate(rawCerts[0])
	if err != nil {
		return fmt.Errorf("failed to parse peer certificate: %v", err)
	}
	_, err = c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		return fmt.Errorf("could not verify peer certificate: %v", err)
	}
	for _, name := range names {
		if c.Subject.CommonName == name {
			return nil
		}
	}
	return fmt.Errorf("common name is invalid, got %s", c.Subject.CommonName)
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

// handshakeLog is a VerifyConnection that logs the handshake and accepts it. conn: the
// server's accepted connection (nil on a client: the config does not know where it dials).
func handshakeLog(hl *log.FilteredLogger, config string, conn net.Conn) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		cn := ""
		if len(cs.PeerCertificates) > 0 {
			cn = cs.PeerCertificates[0].Subject.CommonName
		}
		l := hl.With("config", config, "tls", tlsVersionName(cs.Version), "cipher",
			tls.CipherSuiteName(cs.CipherSuite), "peer", cn)
		if conn != nil {
			l = l.With("local", conn.LocalAddr().String(), "remote", conn.RemoteAddr().String())
		}
		l.Info("tls handshake")
		return nil
	}
}

// serverConfig is SetupTLSForServer's: a fresh config per ClientHello (GetConfigForClient),
// minVersion as the KubeVirt CR's minTLSVersion, no cipher list.
func serverConfig(certFile, keyFile, caFile string, names []string, minVersion uint16,
	hl *log.FilteredLogger) (*tls.Config, error) {
	cert, err := loadPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		InsecureSkipVerify: true,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return cert, nil
		},
		GetConfigForClient: func(info *tls.ClientHelloInfo) (*tls.Config, error) {
			return &tls.Config{
				MinVersion: minVersion,
				ClientCAs:  pool,
				GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
					return cert, nil
				},
				InsecureSkipVerify: true,
				VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
					return verifyPeerCert(raw, pool, x509.ExtKeyUsageClientAuth, names)
				},
				ClientAuth:       tls.RequireAndVerifyClientCert,
				VerifyConnection: handshakeLog(hl, "server", info.Conn),
			}, nil
		},
	}, nil
}

// clientConfig is SetupTLSForClients': the pair as client certificate, the server checked by
// VerifyPeerCertificate only (CA, serverAuth, serverCN). config names it in the handshake lines.
func clientConfig(certFile, keyFile, caFile, serverCN, config string,
	hl *log.FilteredLogger) (*tls.Config, error) {
	cert, err := loadPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	pool, err := loadPool(caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		InsecureSkipVerify: true,
		ClientAuth:         tls.RequireAndVerifyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return cert, nil
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return cert, nil
		},
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			return verifyPeerCert(raw, pool, x509.ExtKeyUsageServerAuth, []string{serverCN})
		},
		VerifyConnection: handshakeLog(hl, config, nil),
	}, nil
}
