// Package kvclient speaks the HTTP API of the example key-value store's nodes (package
// kvnode): reading a key, a node's state, and everything a node holds, which makes a node a
// client.Reader for Sliceplane's convergence checker.
package kvclient

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sliceplane/sliceplane/client"
	"github.com/sliceplane/sliceplane/internal/mtls"
)

// Paths of the node API.
const (
	KeyPath   = "/v1/kv/"
	StatePath = "/v1/state"
	ItemsPath = "/v1/items"
)

// ClockHeader carries, on every answer to a read, the source clock the node's data reflects.
const ClockHeader = "Sliceplane-Clock"

// State is what a node says of itself at StatePath.
type State struct {
	ID          string  `json:"id"`
	Clock       uint64  `json:"clock"`
	Cursor      string  `json:"cursor"`
	Slices      []Slice `json:"slices"`
	Distributor string  `json:"distributor,omitempty"`
	// Fresh says the node answers reads from its data (client.Node.Fresh); StaleReason
	// says why not.
	Fresh       bool   `json:"fresh"`
	StaleReason string `json:"stale_reason,omitempty"`
}

// Slice is a range of the hash space in the API: points in hex, the end of the space as "end".
type Slice struct {
	Start string `json:"start"`
	End   string `json:"end"`
}

// SliceOf returns r in the API's form.
func SliceOf(r client.Range) Slice {
	return Slice{Start: client.BoundAt(r.Start).String(), End: r.End.String()}
}

// Range parses s.
func (s Slice) Range() (client.Range, error) {
	var start, end client.Bound
	if err := start.UnmarshalText([]byte(s.Start)); err != nil {
		return client.Range{}, err
	}
	if start.IsEnd() {
		return client.Range{}, fmt.Errorf("slice starts at the end of the space")
	}
	if err := end.UnmarshalText([]byte(s.End)); err != nil {
		return client.Range{}, err
	}
	r := client.Range{Start: start.Point(), End: end}
	if !r.Valid() {
		return client.Range{}, fmt.Errorf("empty slice %s", r)
	}
	return r, nil
}

// Owner is a node that holds a key, as a node names it when it does not.
type Owner struct {
	ID      string `json:"id"`
	Address string `json:"address,omitempty"`
}

// Misdirected is the body of a 421 answer: the key is not the node's; ask the owners.
type Misdirected struct {
	Error  string  `json:"error"`
	Owners []Owner `json:"owners"`
}

// ErrNotFound is returned by Get for a key the node owns and does not hold.
var ErrNotFound = errors.New("kvclient: no such key")

// NotMineError is returned by Get for a key the node does not own.
type NotMineError struct {
	Node   string
	Owners []Owner
}

// BeyondFreshness is the reason a node gives, in the body of a 503 answer to a read, when its
// data is older than the freshness bound it serves within: the key may be its own, but what
// it holds may be out of date, so the read is better served by another replica.
const BeyondFreshness = "beyond freshness bound"

// StaleError is returned by Get when the node answered 503 giving BeyondFreshness as its
// reason.
type StaleError struct {
	Node string
	// Reason is the node's answer, as it gave it.
	Reason string
}

func (e *StaleError) Error() string {
	return fmt.Sprintf("kvclient: %s is %s: %s", e.Node, BeyondFreshness, e.Reason)
}

func (e *NotMineError) Error() string {
	ids := make([]string, len(e.Owners))
	for i, o := range e.Owners {
		ids[i] = o.ID
	}
	return fmt.Sprintf("kvclient: %s does not hold the key; ask %s", e.Node, strings.Join(ids, ", "))
}

// Node is a client of one node.
type Node struct {
	base string
	http *http.Client
}

// New returns a client of the node serving at base ("https://host:port", or "host:port",
// which means https when hc speaks TLS, http otherwise). A nil hc means http.DefaultClient.
func New(base string, hc *http.Client) *Node {
	if hc == nil {
		hc = http.DefaultClient
	}
	if !strings.Contains(base, "://") {
		base = Scheme(hc) + "://" + base
	}
	return &Node{base: strings.TrimRight(base, "/"), http: hc}
}

// HTTPClient returns an HTTP client of the nodes that presents the certificate of src and
// verifies that the server is a node of its CA (mutual TLS), or a plain one for a nil src.
// timeout bounds each request (0: no bound).
func HTTPClient(src *mtls.Source, timeout time.Duration) *http.Client {
	if src == nil {
		return &http.Client{Timeout: timeout}
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = src.ClientTLS("node")
	return &http.Client{Transport: t, Timeout: timeout}
}

// Scheme returns the URL scheme hc speaks to the nodes: "https" when it was made with TLS
// (HTTPClient with a Source), "http" otherwise.
func Scheme(hc *http.Client) string {
	if hc != nil {
		if t, ok := hc.Transport.(*http.Transport); ok && t.TLSClientConfig != nil {
			return "https"
		}
	}
	return "http"
}

// URL returns the node's base URL.
func (n *Node) URL() string { return n.base }

func (n *Node) get(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.base+path, nil)
	if err != nil {
		return nil, fmt.Errorf("kvclient: %w", err)
	}
	resp, err := n.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("kvclient: %w", err)
	}
	return resp, nil
}

// unexpected turns an answer of an unexpected status into an error, closing its body.
func unexpected(resp *http.Response) error {
	return unexpectedBody(resp, readBody(resp))
}

// readBody returns the start of an answer's body, which is all an error needs, and closes it.
func readBody(resp *http.Response) string {
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return strings.TrimSpace(string(body))
}

func unexpectedBody(resp *http.Response, body string) error {
	return fmt.Errorf("kvclient: %s %s: %s: %s", resp.Request.Method, resp.Request.URL, resp.Status, body)
}

// Get reads key: its value, and the clock the node's data reflects. A key the node owns and
// does not hold is ErrNotFound; one it does not own, a *NotMineError; a node whose data is
// beyond its freshness bound, a *StaleError.
func (n *Node) Get(ctx context.Context, key []byte) (value []byte, clock uint64, err error) {
	resp, err := n.get(ctx, KeyPath+url.PathEscape(string(key)))
	if err != nil {
		return nil, 0, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		defer resp.Body.Close()
		value, err = io.ReadAll(resp.Body)
		if err != nil {
			return nil, 0, fmt.Errorf("kvclient: reading %q from %s: %w", key, n.base, err)
		}
		fmt.Sscan(resp.Header.Get(ClockHeader), &clock) //nolint:errcheck // a missing clock reads as 0
		return value, clock, nil
	case http.StatusNotFound:
		resp.Body.Close()
		return nil, 0, ErrNotFound
	case http.StatusMisdirectedRequest:
		defer resp.Body.Close()
		var m Misdirected
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			return nil, 0, fmt.Errorf("kvclient: decoding the answer of %s: %w", n.base, err)
		}
		return nil, 0, &NotMineError{Node: n.base, Owners: m.Owners}
	case http.StatusServiceUnavailable:
		body := readBody(resp)
		if strings.Contains(body, BeyondFreshness) {
			return nil, 0, &StaleError{Node: n.base, Reason: body}
		}
		return nil, 0, unexpectedBody(resp, body)
	}
	return nil, 0, unexpected(resp)
}

// State returns what the node says of itself.
func (n *Node) State(ctx context.Context) (State, error) {
	resp, err := n.get(ctx, StatePath)
	if err != nil {
		return State{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return State{}, unexpected(resp)
	}
	defer resp.Body.Close()
	var s State
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return State{}, fmt.Errorf("kvclient: decoding the state of %s: %w", n.base, err)
	}
	return s, nil
}

// Slices returns the slices the node holds, in key order (client.Reader).
func (n *Node) Slices(ctx context.Context) ([]client.Range, error) {
	s, err := n.State(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]client.Range, len(s.Slices))
	for i, sl := range s.Slices {
		if out[i], err = sl.Range(); err != nil {
			return nil, fmt.Errorf("kvclient: the state of %s: %w", n.base, err)
		}
	}
	return out, nil
}

// Items calls fn for every item the node holds, until fn fails (client.Reader).
func (n *Node) Items(ctx context.Context, fn func(client.Item) error) error {
	resp, err := n.get(ctx, ItemsPath)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return unexpected(resp)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(bufio.NewReader(resp.Body))
	for {
		var it client.Item
		switch err := dec.Decode(&it); {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return fmt.Errorf("kvclient: reading the items of %s: %w", n.base, err)
		}
		if err := fn(it); err != nil {
			return err
		}
	}
}

// GetItem returns one item as the node stores it, with its fragments, and whether it is held
// (client.Reader). It reads the whole item list: it is for checks, not for serving.
func (n *Node) GetItem(ctx context.Context, key []byte) (client.Item, bool, error) {
	var found client.Item
	var ok bool
	err := n.Items(ctx, func(it client.Item) error {
		if string(it.Key) == string(key) {
			found, ok = it, true
		}
		return nil
	})
	return found, ok, err
}

// Reader adapts a Node to client.Reader, whose Get returns whole items.
type Reader struct{ *Node }

// Get returns an item and whether the node holds it.
func (r Reader) Get(ctx context.Context, key []byte) (client.Item, bool, error) {
	return r.GetItem(ctx, key)
}

var _ client.Reader = Reader{}
