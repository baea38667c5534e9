// SPDX-License-Identifier: Apache-2.0

// Package testpki makes certificates as virt-operator issues them (reference kubevirt-dropin.md
// §4), for tests: an ECDSA P-256 CA, the handler's server leaf (CN
// kubevirt.io:system:node:virt-handler, serverAuth only) and the migration client leaf (CN
// kubevirt.io:system:client:migration, clientAuth), no SAN a peer's address could be checked
// against.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// Certs names the PEM files Make wrote: the CA bundle (as kubevirt-ca's ca-bundle), and each pair
// in a directory of its own, tls.crt and tls.key, as the secrets are mounted.
type Certs struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
}

// Fataler is the part of testing.TB this package uses.
type Fataler interface {
	Fatal(args ...interface{})
}

func writePEM(t Fataler, path, kind string, der []byte) {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Make writes a CA, the server pair (servercertificates/) and the migration client pair
// (migrationclientcertificates/) under dir.
func Make(t Fataler, dir string) Certs {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubevirt.io@test"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	c := Certs{CA: filepath.Join(dir, "ca-bundle")}
	writePEM(t, c.CA, "CERTIFICATE", caDER)

	leaf := func(serial int64, name, cn string, eku x509.ExtKeyUsage, dnsNames []string) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			DNSNames:     dnsNames,
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage:  []x509.ExtKeyUsage{eku},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		sub := filepath.Join(dir, name)
		if err := os.MkdirAll(sub, 0o700); err != nil {
			t.Fatal(err)
		}
		crt, k := filepath.Join(sub, "tls.crt"), filepath.Join(sub, "tls.key")
		writePEM(t, crt, "CERTIFICATE", der)
		writePEM(t, k, "EC PRIVATE KEY", keyDER)
		return crt, k
	}
	c.ServerCert, c.ServerKey = leaf(2, "servercertificates", "kubevirt.io:system:node:virt-handler", x509.ExtKeyUsageServerAuth,
		[]string{"virt-handler", "virt-handler.kubevirt", "virt-handler.kubevirt.svc"})
	c.ClientCert, c.ClientKey = leaf(3, "migrationclientcertificates", "kubevirt.io:system:client:migration", x509.ExtKeyUsageClientAuth, nil)
	return c
}
