package slicectl

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/internal/mtls"
)

// certShowOut is what certs show says of one certificate file.
type certShowOut struct {
	File      string    `json:"file"`
	Identity  string    `json:"identity,omitempty"`
	Subject   string    `json:"subject"`
	Issuer    string    `json:"issuer"`
	IsCA      bool      `json:"is_ca"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	// Validity is "valid", "expired" or "not yet valid", now.
	Validity string   `json:"validity"`
	Hosts    []string `json:"hosts,omitempty"`
	// Verified says whether the certificate chains to --ca ("" without --ca).
	Verified string `json:"verified,omitempty"`
}

func newCertsShowCommand(g *globalOptions) *cobra.Command {
	var caFile string
	cmd := &cobra.Command{
		Use:   "show FILE...",
		Short: "Say what a certificate file holds: identity, issuer, validity",
		Long: `show reads PEM certificate files (the first certificate of each) and prints the
Sliceplane identity each names (its spiffe://sliceplane/<kind>/<name> URI SAN),
its subject and issuer, when it is valid and whether it is valid now, and the
host names and addresses it serves as. With --ca it also says whether the
certificate chains to that CA, as a Sliceplane server would check it.`,
		Example: `  slicectl certs show certs/admin-alice.crt
  slicectl certs show certs/*.crt --ca certs/ca.crt -o json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError(fmt.Errorf("missing FILE (usage: %s)", cmd.UseLine()))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.check(outputs); err != nil {
				return usageError(err)
			}
			return showCerts(cmd.OutOrStdout(), g.output, args, caFile)
		},
	}
	cmd.Flags().StringVar(&caFile, "ca", "", "PEM CA file to verify the certificates against")
	return cmd
}

func showCerts(w io.Writer, format string, files []string, caFile string) error {
	var roots *x509.CertPool
	if caFile != "" {
		data, err := os.ReadFile(caFile)
		if err != nil {
			return fmt.Errorf("--ca: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(data) {
			return fmt.Errorf("--ca %s holds no PEM certificate", caFile)
		}
	}
	var outs []certShowOut
	for _, f := range files {
		c, err := readCert(f)
		if err != nil {
			return err
		}
		outs = append(outs, describeCert(f, c, roots, time.Now()))
	}
	p := newPrinter(w, format)
	if !p.table() {
		return p.print(outs)
	}
	for i, o := range outs {
		if i > 0 {
			fmt.Fprintln(w)
		}
		t := newTable(w)
		row(t, "file:", o.File)
		row(t, "identity:", orDash(o.Identity))
		row(t, "subject:", o.Subject)
		row(t, "issuer:", o.Issuer)
		row(t, "valid:", fmt.Sprintf("%s to %s (%s)", o.NotBefore.UTC().Format(time.RFC3339), o.NotAfter.UTC().Format(time.RFC3339), o.Validity))
		if o.IsCA {
			row(t, "CA:", "yes")
		}
		if len(o.Hosts) > 0 {
			row(t, "hosts:", strings.Join(o.Hosts, ", "))
		}
		if o.Verified != "" {
			row(t, "verified:", o.Verified)
		}
		if err := t.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func readCert(path string) (*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil, fmt.Errorf("%s holds no PEM certificate", path)
		}
		if b.Type == "CERTIFICATE" {
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			return c, nil
		}
	}
}

func describeCert(file string, c *x509.Certificate, roots *x509.CertPool, now time.Time) certShowOut {
	o := certShowOut{
		File: file, Subject: c.Subject.String(), Issuer: c.Issuer.String(), IsCA: c.IsCA,
		NotBefore: c.NotBefore, NotAfter: c.NotAfter, Validity: "valid",
	}
	if id, err := mtls.IdentityOf(c); err == nil {
		o.Identity = id.ID
	} else if !errors.Is(err, mtls.ErrNoIdentity) || len(c.URIs) > 0 {
		o.Identity = "(" + err.Error() + ")"
	}
	switch {
	case now.After(c.NotAfter):
		o.Validity = "expired"
	case now.Before(c.NotBefore):
		o.Validity = "not yet valid"
	}
	o.Hosts = append(o.Hosts, c.DNSNames...)
	for _, ip := range c.IPAddresses {
		o.Hosts = append(o.Hosts, ip.String())
	}
	if roots != nil {
		_, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		o.Verified = "yes, by --ca"
		if err != nil {
			o.Verified = "no: " + err.Error()
		}
	}
	return o
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
