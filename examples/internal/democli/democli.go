// Package democli holds what the examples' demo commands share: their logger, their
// DEMO_SECONDS and their two-stage Ctrl-C.
package democli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/sliceplane/sliceplane/internal/logging"
)

// Setup returns the logger of a demo command's diagnostics, at level, and sets *d from
// $DEMO_SECONDS unless --duration was given (DurationFromEnv).
func Setup(cmd *cobra.Command, level string, d *time.Duration) (*slog.Logger, error) {
	log, err := logging.New(os.Stderr, level, "text")
	if err != nil {
		return nil, err
	}
	return log, DurationFromEnv(cmd, d)
}

// DurationFromEnv sets *d from $DEMO_SECONDS, which make demo passes on, unless --duration
// was given: the flag wins.
func DurationFromEnv(cmd *cobra.Command, d *time.Duration) error {
	if cmd.Flags().Changed("duration") {
		return nil
	}
	if s := os.Getenv("DEMO_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return fmt.Errorf("DEMO_SECONDS=%q: want a whole number of seconds >= 1", s)
		}
		*d = time.Duration(n) * time.Second
	}
	return nil
}

// TwoStages gives the two signals on signals their meaning: the first closes the returned
// channel, which ends the load and starts the final check; the second calls abandon. Its
// goroutine ends with ctx.
func TwoStages(ctx context.Context, signals <-chan os.Signal, abandon context.CancelFunc) <-chan struct{} {
	stop := make(chan struct{})
	go func() {
		select {
		case <-signals:
			close(stop)
		case <-ctx.Done():
			return
		}
		select {
		case <-signals:
			abandon()
		case <-ctx.Done():
		}
	}()
	return stop
}
