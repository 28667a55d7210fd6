package slicectl

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/internal/certs"
)

// certsInitOptions are the flags of certs init: the names of each kind of identity.
type certsInitOptions struct {
	*globalOptions
	names    map[string]*[]string // by kind
	hosts    []string
	validity time.Duration
}

// certKinds are the kinds certs init issues, in the order it prints them; the ones that
// serve get --host in their certificates, and the ones a person may use in a browser (the
// assigner's web view) also get a PKCS#12 file, the form a browser imports.
var certKinds = []struct {
	kind, help      string
	serves, browser bool
}{
	{"assigner", "assigner names", true, false},
	{"distributor", "distributor names", true, false},
	{"node", "storage node IDs", true, false},
	{"etcd", "etcd members (a kind Sliceplane's servers give no role)", true, false},
	{"router", "router names", false, false},
	{"admin", "admins: people or tools that may override the assignment", false, true},
	{"viewer", "viewers: people or tools that may only inspect", false, true},
}

// caValidity is the least a new CA is valid for: longer than the certificates it signs, so
// that a rerun with the same CA can issue more.
const caValidity = 10 * 365 * 24 * time.Hour

func newCertsInitCommand(g *globalOptions) *cobra.Command {
	o := &certsInitOptions{globalOptions: g, names: map[string]*[]string{}}
	cmd := &cobra.Command{
		Use:   "init DIR",
		Short: "Make a development CA and the certificates of a cluster's identities",
		Long: `init writes into DIR a certificate authority (ca.crt, ca.key) and, for each
identity named by the flags, a certificate and its key: <kind>-<name>.crt and
<kind>-<name>.key, valid for --validity. Admins and viewers, who may open the
assigner's web view in a browser, also get <kind>-<name>.p12: the certificate,
its key and ca.crt in the PKCS#12 form a browser imports, with an empty password
(see docs/SECURITY.md). Keys and .p12 files are readable by their owner only.

A CA already in DIR is reused, so that a rerun adds identities (or renews their
certificates, replacing the files, .p12 included) and every certificate stays
trusted. A name may hold letters, digits, '-', '_' and '.'; a bad one is refused
before anything is written. With --target T the identities made are confined to
target T (spiffe://sliceplane/target/T/<kind>/<name>, files
target-T-<kind>-<name>.*): a member, router or admin of one sharded service that
no other target accepts; assigners, distributors and etcd are confined to none.

The certificates of the servers (assigner, distributor, node, etcd) are valid for
localhost and the loopback addresses, plus --host, for the tools that check host
names (curl, etcdctl, Prometheus); Sliceplane itself checks identities.`,
		Example: `  # Everything a local cluster and its operators need.
  slicectl certs init certs --assigner a1 --distributor d1 --node n1,n2,n3 --router r --admin alice --viewer ci

  # Servers reachable by other names; certificates valid for 30 days.
  slicectl certs init certs --node n1,n2 --host n1.example.com,10.0.0.5 --validity 720h

  # Add an admin later: the CA in certs is reused.
  slicectl certs init certs --admin bob

  # The members, router and admin of target kv, which no other target accepts.
  slicectl --target kv certs init certs --node m1,m2 --router kvproxy --admin kvops`,
		Args: positional("DIR")(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.OutOrStdout(), args[0])
		},
	}
	f := cmd.Flags()
	for _, k := range certKinds {
		o.names[k.kind] = new([]string)
		f.StringSliceVar(o.names[k.kind], k.kind, nil, k.help+", comma-separated")
	}
	f.StringSliceVar(&o.hosts, "host", nil, "extra DNS names or IP addresses of the servers' certificates, comma-separated")
	f.DurationVar(&o.validity, "validity", certs.DefaultValidity, "how long the certificates are valid")
	return cmd
}

// certsInitOut is the result of certs init, in --output json and yaml.
type certsInitOut struct {
	Dir        string         `json:"dir"`
	CA         string         `json:"ca"`
	CAKey      string         `json:"ca_key"`
	CAReused   bool           `json:"ca_reused"`
	Identities []certIdentity `json:"identities"`
}

type certIdentity struct {
	ID   string `json:"id"`
	Cert string `json:"cert"`
	Key  string `json:"key"`
	// P12 is the PKCS#12 file of an identity a person may use in a browser.
	P12      string    `json:"p12,omitempty"`
	NotAfter time.Time `json:"not_after"`
}

// issued is one certificate made in memory, not yet written.
type issued struct {
	req     certs.Request
	leaf    *certs.Leaf
	browser bool
}

func (o *certsInitOptions) run(w io.Writer, dir string) error {
	if err := o.check(outputs); err != nil {
		return usageError(err)
	}
	if o.validity <= 0 {
		return usageError(fmt.Errorf("--validity %s: want a positive duration", o.validity))
	}
	ca, reused, err := loadOrMakeCA(dir, o.validity)
	if err != nil {
		return err
	}
	// Every certificate is made before any file is written: a bad name leaves DIR as it was.
	leaves, err := o.issueAll(ca)
	if err != nil {
		return err
	}
	if !reused {
		if err := certs.WriteCA(dir, ca); err != nil {
			return err
		}
	}
	out := certsInitOut{Dir: dir, CA: filepath.Join(dir, "ca.crt"), CAKey: filepath.Join(dir, "ca.key"), CAReused: reused}
	for _, l := range leaves {
		id, err := writeIdentity(dir, ca, l)
		if err != nil {
			return err
		}
		out.Identities = append(out.Identities, id)
	}
	p := newPrinter(w, o.output)
	if !p.table() {
		return p.print(out)
	}
	return printCertsInit(w, out)
}

// writeIdentity writes the files of one identity: its certificate and key, and its PKCS#12
// file when a person may use it in a browser.
func writeIdentity(dir string, ca *certs.CA, l issued) (certIdentity, error) {
	files, err := certs.WriteLeaf(dir, l.req, l.leaf)
	if err != nil {
		return certIdentity{}, err
	}
	id := certIdentity{ID: l.req.ID(), Cert: files.Cert, Key: files.Key, NotAfter: l.leaf.Cert.NotAfter}
	if l.browser {
		if id.P12, err = certs.WritePKCS12(dir, l.req, l.leaf, ca.Cert); err != nil {
			return certIdentity{}, err
		}
	}
	return id, nil
}

// loadOrMakeCA returns the CA in dir, or a new one (not yet written) when dir holds none.
func loadOrMakeCA(dir string, validity time.Duration) (*certs.CA, bool, error) {
	_, crtErr := os.Stat(filepath.Join(dir, "ca.crt"))
	_, keyErr := os.Stat(filepath.Join(dir, "ca.key"))
	switch {
	case crtErr == nil && keyErr == nil:
		ca, err := certs.LoadCA(dir)
		if err != nil {
			return nil, false, fmt.Errorf("reusing the CA in %s: %w", dir, err)
		}
		return ca, true, nil
	case errors.Is(crtErr, fs.ErrNotExist) && errors.Is(keyErr, fs.ErrNotExist):
		ca, err := certs.NewCA("Sliceplane development CA", max(validity+time.Hour, caValidity))
		return ca, false, err
	case crtErr == nil || keyErr == nil:
		return nil, false, fmt.Errorf("%s holds one of ca.crt and ca.key but not the other: "+
			"give a directory with both (to reuse the CA) or neither (to make one)", dir)
	}
	return nil, false, fmt.Errorf("reading the CA in %s: %w", dir, errors.Join(crtErr, keyErr))
}

// issueAll makes the certificate of every identity the flags name.
func (o *certsInitOptions) issueAll(ca *certs.CA) ([]issued, error) {
	notAfter := time.Now().Add(o.validity)
	if notAfter.After(ca.Cert.NotAfter) {
		return nil, usageError(fmt.Errorf("--validity %s: the certificates would outlive the CA (valid until %s)",
			o.validity, ca.Cert.NotAfter.UTC().Format(time.RFC3339)))
	}
	seen := map[string]bool{}
	var out []issued
	for _, k := range certKinds {
		for _, name := range *o.names[k.kind] {
			name = strings.TrimSpace(name)
			if seen[k.kind+"/"+name] {
				return nil, usageError(fmt.Errorf("--%s %q is named twice", k.kind, name))
			}
			seen[k.kind+"/"+name] = true
			if o.globalOptions.target != "" && (k.kind == "assigner" || k.kind == "distributor" || k.kind == "etcd") {
				return nil, usageError(fmt.Errorf("--%s with --target: assigners and distributors are the control plane's, confined to no target", k.kind))
			}
			req := certs.Request{Kind: k.kind, Name: name, Target: o.globalOptions.target, NotAfter: notAfter}
			if k.serves {
				req.Hosts = o.hosts
			}
			leaf, err := ca.Issue(req)
			if errors.Is(err, certs.ErrInvalid) {
				return nil, usageError(fmt.Errorf("--%s: %w; nothing was written", k.kind, err))
			}
			if err != nil {
				return nil, err
			}
			out = append(out, issued{req: req, leaf: leaf, browser: k.browser})
		}
	}
	return out, nil
}

// printCertsInit says what was written and how to use it.
func printCertsInit(w io.Writer, out certsInitOut) error {
	verb := "wrote a new CA"
	if out.CAReused {
		verb = "reused the CA"
	}
	fmt.Fprintf(w, "%s: %s, %s (keep ca.key private: it signs certificates)\n", verb, out.CA, out.CAKey)
	if len(out.Identities) == 0 {
		_, err := fmt.Fprintln(w, "no identities named: give --node, --admin, ... to issue certificates")
		return err
	}
	t := newTable(w)
	row(t, "IDENTITY", "CERTIFICATE", "KEY", "VALID UNTIL")
	for _, id := range out.Identities {
		row(t, id.ID, id.Cert, id.Key, id.NotAfter.UTC().Format(time.RFC3339))
	}
	if err := t.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nEach process takes its own files:")
	for _, id := range out.Identities {
		fmt.Fprintf(w, "  %-40s --tls-cert %s --tls-key %s --tls-ca %s\n", id.ID, id.Cert, id.Key, out.CA)
	}
	printBrowserFiles(w, out)
	for _, id := range out.Identities {
		if strings.Contains(id.ID, "/admin/") || strings.Contains(id.ID, "/viewer/") {
			_, err := fmt.Fprintf(w, "\nslicectl as %s, for this shell:\n  export %s=%s %s=%s %s=%s\n",
				id.ID, envTLSCert, id.Cert, envTLSKey, id.Key, envTLSCA, out.CA)
			return err
		}
	}
	return nil
}

// printBrowserFiles lists the PKCS#12 files, which a person imports into a browser to open
// the assigner's web view.
func printBrowserFiles(w io.Writer, out certsInitOut) {
	header := false
	for _, id := range out.Identities {
		if id.P12 == "" {
			continue
		}
		if !header {
			fmt.Fprintf(w, "\nIn a browser, for the assigner's web view at https://<its --metrics-listen>/ui/: import\n"+
				"(empty password), and trust %s as an authority; see docs/SECURITY.md.\n", out.CA)
			header = true
		}
		fmt.Fprintf(w, "  %-40s %s\n", id.ID, id.P12)
	}
}
