package postgres

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/sliceplane/sliceplane/internal/source"
)

// Config says where the items are and how the source reads them.
type Config struct {
	// DSN connects to the database (a URL or key=value pairs, as libpq takes them; TLS by
	// sslmode, sslrootcert, sslcert and sslkey). Watch connects with it for replication.
	DSN string
	// Table holds the items, optionally schema-qualified; default "sliceplane_items".
	Table string
	// Columns names the table's columns; defaults DefaultColumns.
	Columns Columns
	// Publication is the publication of Table that Watch follows; default "sliceplane".
	// Open creates it when it is missing.
	Publication string
	// Slot is the logical replication slot Watch reads through, which the source creates when
	// missing and owns: each distributor needs its own. Empty: the source does not Watch
	// (an assigner follows only the clock).
	Slot string
	// ChunkRows is how many rows one query of a Scan reads; default 1000.
	ChunkRows int
	// Status is the time between the status updates a watch sends (which confirm what it
	// read and ask for the server's progress); default 100 ms.
	Status time.Duration
	// Timeout is how long the source waits for the server to answer a request of its own (a
	// clock read, a slot's state, a flush), and how long a replication stream may stay
	// silent while it asks for the server's status every Status: past it the server counts
	// as unreachable (source.Unavailable) and the request is given up, so that a link that
	// drops every packet is noticed as soon as one that resets. Default 2 s; a chunk of a
	// scan gets ten times as long.
	Timeout time.Duration
	// Logger reports rows skipped and replication restarts; default slog.Default().
	Logger *slog.Logger
	// Rejected, if set, is told of every row skipped, with the reason.
	Rejected func(source.RejectReason)
}

// Columns names the columns of the items table.
type Columns struct {
	// Key is the item's key: bytea (its bytes) or any other type (its text form).
	Key string
	// Fragment is the fragment ID, text; "" is the item's own row. Empty name: the table
	// has no fragments, each row is an item.
	Fragment string
	// Value is the value: bytea (its bytes) or any other type (its text form).
	Value string
	// Hash is the BIGINT placement column: xxhash64 of the key with its top bit flipped
	// (HashColumn), indexed, so that a slice is one index range.
	Hash string
}

// DefaultColumns are the columns of the table Init creates.
var DefaultColumns = Columns{Key: "key", Fragment: "fragment", Value: "value", Hash: "sp_hash"}

// DefaultTable is the table Init creates when Config.Table is empty.
const DefaultTable = "sliceplane_items"

// ident is what the source accepts as a name: plain SQL identifiers, so that it can quote
// them without surprises.
var ident = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Validate fills the defaults and rejects what cannot work, naming the field.
func (c *Config) Validate() error {
	if c.DSN == "" {
		return errors.New("postgres: a DSN is required")
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.Columns == (Columns{}) {
		c.Columns = DefaultColumns
	}
	if c.Publication == "" {
		c.Publication = "sliceplane"
	}
	if c.ChunkRows <= 0 {
		c.ChunkRows = 1000
	}
	if c.Status <= 0 {
		c.Status = 100 * time.Millisecond
	}
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
	if c.Timeout < 2*c.Status {
		return fmt.Errorf("postgres: timeout %s: want at least twice the status interval (%s)", c.Timeout, c.Status)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if _, _, err := splitTable(c.Table); err != nil {
		return err
	}
	names := map[string]string{"key column": c.Columns.Key, "value column": c.Columns.Value,
		"hash column": c.Columns.Hash, "publication": c.Publication}
	if c.Columns.Fragment != "" {
		names["fragment column"] = c.Columns.Fragment
	}
	if c.Slot != "" {
		names["slot"] = c.Slot
	}
	for what, name := range names {
		if !ident.MatchString(name) {
			return fmt.Errorf("postgres: %s %q: want a plain identifier (letters, digits, _; at most 63)", what, name)
		}
	}
	return nil
}

// splitTable splits "schema.table" (or "table", in public).
func splitTable(t string) (schema, table string, err error) {
	schema, table = "public", t
	for i := range len(t) {
		if t[i] == '.' {
			schema, table = t[:i], t[i+1:]
			break
		}
	}
	if !ident.MatchString(schema) || !ident.MatchString(table) {
		return "", "", fmt.Errorf("postgres: table %q: want [schema.]table of plain identifiers", t)
	}
	return schema, table, nil
}

// SlotName returns the replication slot name for a distributor's ID. A slot name holds only
// lower-case letters, digits and "_", in at most 63 bytes: an ID that needs changing to fit
// gets its hash appended, so that two IDs never share a slot.
func SlotName(id string) string {
	b := []byte("sliceplane_")
	changed := false
	for i := range len(id) {
		switch c := id[i]; {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_':
			b = append(b, c)
		default:
			b, changed = append(b, '_'), true
		}
	}
	if !changed && len(b) <= 63 {
		return string(b)
	}
	return fmt.Sprintf("%s_%016x", b[:min(len(b), 63-17)], xxhash.Sum64String(id))
}
