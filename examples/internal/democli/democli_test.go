package democli

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

func newCommand(d *time.Duration) *cobra.Command {
	cmd := &cobra.Command{}
	cmd.Flags().DurationVar(d, "duration", 0, "")
	return cmd
}

// DEMO_SECONDS sets the duration, unless --duration was given; it must be whole seconds.
func TestDurationFromEnv(t *testing.T) {
	t.Setenv("DEMO_SECONDS", "30")
	var d time.Duration
	if err := DurationFromEnv(newCommand(&d), &d); err != nil || d != 30*time.Second {
		t.Errorf("DEMO_SECONDS=30: %s, %v", d, err)
	}
	cmd := newCommand(&d)
	if err := cmd.Flags().Set("duration", "5s"); err != nil {
		t.Fatal(err)
	}
	if err := DurationFromEnv(cmd, &d); err != nil || d != 5*time.Second {
		t.Errorf("--duration 5s beside DEMO_SECONDS=30: %s, %v", d, err)
	}
	for _, bad := range []string{"0", "1.5", "x"} {
		t.Setenv("DEMO_SECONDS", bad)
		if err := DurationFromEnv(newCommand(&d), &d); err == nil {
			t.Errorf("DEMO_SECONDS=%s: no error", bad)
		}
	}
}

// The first signal stops the load, the second abandons the check.
func TestTwoStages(t *testing.T) {
	ctx, abandon := context.WithCancel(context.Background())
	defer abandon()
	signals := make(chan os.Signal, 2)
	stop := TwoStages(ctx, signals, abandon)
	signals <- os.Interrupt
	<-stop
	if ctx.Err() != nil {
		t.Fatal("the first signal abandoned the check")
	}
	signals <- os.Interrupt
	<-ctx.Done()
}
