package slicectl

import (
	"context"
	"errors"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/internal/source/postgres"
	"github.com/sliceplane/sliceplane/internal/sourceflag"
)

// pgOptions are the flags shared by the pg commands.
type pgOptions struct {
	*globalOptions
	cfg postgres.Config
}

func newPGCommand(g *globalOptions) *cobra.Command {
	o := &pgOptions{globalOptions: g}
	cmd := &cobra.Command{
		Use:   "pg",
		Short: "Prepare and inspect a PostgreSQL table as the data source",
		Long: `pg prepares a PostgreSQL table to be sharded onto nodes (--source postgres of the
assigner and distributors) and shows its state. The table needs a BIGINT placement
column holding each key's xxhash64 with its top bit flipped, indexed, so that a
slice is one index range: init creates a new table with one, backfill fills the
column of an existing table's rows, status counts the rows without one and shows
the replication slots the distributors read through, and how much WAL each holds.

The server needs wal_level=logical. See docs/POSTGRES.md.`,
		Example: `  # A new table, the publication, then the services.
  slicectl pg init --pg-dsn postgres://app@db/app
  assigner --source postgres --pg-dsn postgres://app@db/app
  distributor --id d1 --source postgres --pg-dsn postgres://app@db/app

  # An existing table users(name text primary key, profile jsonb).
  psql -c 'ALTER TABLE users ADD COLUMN sp_hash bigint; CREATE INDEX ON users (sp_hash)'
  slicectl pg backfill --pg-dsn postgres://app@db/app --pg-table users \
    --pg-key-column name --pg-value-column profile --pg-fragment-column ''
  slicectl pg status --pg-dsn postgres://app@db/app --pg-table users --pg-key-column name ...`,
		Args: cobra.ArbitraryArgs,
		RunE: helpOrUnknown,
	}
	sourceflag.AddPostgresFlags(cmd.PersistentFlags(), &o.cfg, "")
	cmd.AddCommand(newPGInitCommand(o), newPGBackfillCommand(o), newPGStatusCommand(o))
	return cmd
}

// check validates the shared flags before anything reaches the server.
func (o *pgOptions) check() error {
	if err := o.globalOptions.check(outputs); err != nil {
		return err
	}
	if o.cfg.DSN == "" {
		return errors.New("--pg-dsn is required")
	}
	cfg := o.cfg
	return cfg.Validate()
}

// withSource runs fn with the table opened as a source (without a slot), within --timeout.
func (o *pgOptions) withSource(cmd *cobra.Command, fn func(ctx context.Context, s *postgres.Source) error) error {
	ctx, cancel := o.context(cmd)
	defer cancel()
	s, err := postgres.Open(ctx, o.cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	return fn(ctx, s)
}

// context returns the command's context bounded by --timeout.
func (o *pgOptions) context(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	parent := cmd.Context()
	if parent == nil {
		parent = context.Background()
	}
	return context.WithTimeout(parent, o.timeout)
}
