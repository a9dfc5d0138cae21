package main

// A throwaway CA, a server certificate for the provider and a client certificate for the
// autoscaler, as deploy/'s cert-manager Certificates give them (mutual TLS).

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// TLSFiles are the PEM files of one run.
type TLSFiles struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

func issue(dir, name string, tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, string, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, "", "", err
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, "", "", err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, "", "", err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, "", "", err
	}
	certPath, keyPath := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return nil, nil, "", "", err
	}
	if err := writePEM(keyPath, "PRIVATE KEY", keyDER); err != nil {
		return nil, nil, "", "", err
	}
	return cert, key, certPath, keyPath, nil
}

// newSerial is a random certificate serial number.
func newSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

func pkixName(cn string) pkix.Name { return pkix.Name{CommonName: cn} }

// serverTemplate is a serving certificate for localhost and 127.0.0.1.
func serverTemplate(cn string, notBefore time.Time) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber: newSerial(), Subject: pkixName(cn),
		NotBefore: notBefore, NotAfter: notBefore.Add(48 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
}

// MakeTLS writes a CA, the provider's server certificate (localhost, 127.0.0.1) and the
// autoscaler's client certificate (DNS name client) into dir.
func MakeTLS(dir, client string) (TLSFiles, error) {
	now := time.Now().Add(-time.Hour)
	ca, caKey, caPath, _, err := issue(dir, "ca", &x509.Certificate{
		SerialNumber: newSerial(), Subject: pkix.Name{CommonName: "upstream-autoscaler test CA"},
		NotBefore: now, NotAfter: now.Add(48 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil, nil)
	if err != nil {
		return TLSFiles{}, err
	}
	_, _, sc, sk, err := issue(dir, "server", serverTemplate("cks-autoscaler-provider", now), ca, caKey)
	if err != nil {
		return TLSFiles{}, err
	}
	_, _, cc, ck, err := issue(dir, "client", &x509.Certificate{
		SerialNumber: newSerial(), Subject: pkix.Name{CommonName: client},
		NotBefore: now, NotAfter: now.Add(48 * time.Hour), DNSNames: []string{client},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, caKey)
	if err != nil {
		return TLSFiles{}, err
	}
	return TLSFiles{CA: caPath, ServerCert: sc, ServerKey: sk, ClientCert: cc, ClientKey: ck}, nil
}
