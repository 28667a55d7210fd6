package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestExitCodes(t *testing.T) {
	require.Equal(t, 0, ExitCode(nil))
	require.Equal(t, 2, ExitCode(fmt.Errorf("%w: --listen: missing port", ErrUsage)))
	require.Equal(t, 130, ExitCode(fmt.Errorf("watching: %w", context.Canceled)))
	require.Equal(t, 1, ExitCode(errors.New("etcd: unreachable")))
}

func TestMainReportsTheErrorUnderTheCommandsName(t *testing.T) {
	var stderr bytes.Buffer
	code := run1("distributor", func(context.Context) error { return fmt.Errorf("%w: bad --listen", ErrUsage) }, &stderr)
	require.Equal(t, 2, code)
	require.Equal(t, "distributor: usage: bad --listen\n", stderr.String())
	stderr.Reset()
	require.Equal(t, 0, run1("assigner", func(context.Context) error { return nil }, &stderr))
	require.Empty(t, stderr.String())
}
