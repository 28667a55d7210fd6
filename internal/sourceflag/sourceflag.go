// Package sourceflag is the command line's choice of the data source, one set of flags that
// the assigner and the distributor share: the etcd prefix (the default, zero setup) or a
// PostgreSQL table followed by logical replication.
package sourceflag

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/pflag"

	"github.com/sliceplane/sliceplane/internal/source"
	"github.com/sliceplane/sliceplane/internal/source/postgres"
)

// The kinds of source.
const (
	Etcd     = "etcd"
	Postgres = "postgres"
)

// Options are the flags' values.
type Options struct {
	Kind string
	PG   postgres.Config
}

// AddFlags adds --source and the --pg-* flags.
func (o *Options) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&o.Kind, "source", Etcd, "where the items are: etcd (under the prefix's data/) or postgres (a table, by logical replication: --pg-dsn, --pg-table)")
	AddPostgresFlags(f, &o.PG, "with --source postgres: ")
}

// AddPostgresFlags adds the --pg-* flags of a PostgreSQL source to f, each help prefixed
// with when.
func AddPostgresFlags(f *pflag.FlagSet, c *postgres.Config, when string) {
	f.StringVar(&c.DSN, "pg-dsn", "", when+"the database, as libpq takes it (TLS: sslmode=verify-full sslrootcert=... sslcert=... sslkey=...)")
	f.StringVar(&c.Table, "pg-table", postgres.DefaultTable, when+"the table of items, [schema.]table")
	f.StringVar(&c.Columns.Key, "pg-key-column", postgres.DefaultColumns.Key, when+"the key column (bytea: its bytes; any other type: its text)")
	f.StringVar(&c.Columns.Value, "pg-value-column", postgres.DefaultColumns.Value, when+"the value column (bytea: its bytes; any other type: its text)")
	f.StringVar(&c.Columns.Hash, "pg-hash-column", postgres.DefaultColumns.Hash, when+"the BIGINT placement column, indexed (slicectl pg backfill fills it)")
	f.StringVar(&c.Columns.Fragment, "pg-fragment-column", postgres.DefaultColumns.Fragment, when+"the fragment ID column; empty: each row is an item")
	f.StringVar(&c.Publication, "pg-publication", "sliceplane", when+"the publication of the table, created when missing")
	f.DurationVar(&c.Timeout, "pg-timeout", 2*time.Second, when+"how long a request, or a replication stream, may go unanswered before the server counts as unreachable")
}

// Validate checks the choice, naming the flag at fault.
func (o *Options) Validate() error {
	switch o.Kind {
	case Etcd, "":
		return nil
	case Postgres:
		if o.PG.DSN == "" {
			return fmt.Errorf("--source postgres needs --pg-dsn")
		}
		cfg := o.PG
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("--source postgres: %w", err)
		}
		return nil
	}
	return fmt.Errorf("--source %q: want etcd or postgres", o.Kind)
}

// Open opens the PostgreSQL source, reading through the replication slot slot ("" for one
// that follows only the clock); it returns nil for etcd, whose source the caller makes. A
// source that cannot be reached now does not stop the process: it is checked again at its
// first use, and the process serves (a standby campaigns) meanwhile; one that answers but
// cannot work as configured (source.Misconfigured) is refused at once, with what to fix.
func (o *Options) Open(ctx context.Context, slot string, log *slog.Logger, rejected func(source.RejectReason)) (*postgres.Source, error) {
	if o.Kind != Postgres {
		return nil, nil
	}
	cfg := o.PG
	cfg.Slot, cfg.Logger, cfg.Rejected = slot, log, rejected
	s, err := postgres.New(cfg)
	if err != nil {
		return nil, err
	}
	switch err := s.Check(ctx); {
	case err == nil:
	case source.ClassOf(err) == source.Misconfigured:
		s.Close()
		return nil, err
	default:
		log.Warn("the source is unreachable; starting all the same, and checking it again at its first use", "err", err)
	}
	return s, nil
}
