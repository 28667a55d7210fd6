package source

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

func TestClassOf(t *testing.T) {
	base := errors.New("boom")
	un, mis := MarkUnavailable(base), MarkMisconfigured(base)
	for _, tc := range []struct {
		err  error
		want Class
	}{
		{nil, 0},
		{un, Unavailable},
		{mis, Misconfigured},
		{fmt.Errorf("wrapped: %w", mis), Misconfigured},
		{MarkUnavailable(mis), Misconfigured}, // the innermost mark wins
		{fmt.Errorf("%w: gone", ErrCompacted), Compacted},
		{MarkMisconfigured(fmt.Errorf("%w: gone", ErrCompacted)), Compacted},
		{base, Unavailable}, // unmarked: retried, never taken for a setup to fix
		{context.DeadlineExceeded, Unavailable},
	} {
		if got := ClassOf(tc.err); got != tc.want {
			t.Errorf("ClassOf(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
	if un.Error() != "boom" || !errors.Is(un, base) || !errors.Is(un, ErrUnavailable) || errors.Is(un, ErrMisconfigured) {
		t.Errorf("a marked error reads %q and matches its class only", un)
	}
	if !errors.Is(mis, ErrMisconfigured) || errors.Is(mis, ErrUnavailable) {
		t.Error("MarkMisconfigured does not match ErrMisconfigured alone")
	}
	if MarkUnavailable(nil) != nil {
		t.Error("MarkUnavailable(nil) is not nil")
	}
}

func TestEtcdErrorsAreClassified(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want Class
	}{
		{rpctypes.ErrPermissionDenied, Misconfigured},
		{rpctypes.ErrAuthFailed, Misconfigured},
		{rpctypes.ErrUserEmpty, Misconfigured},
		{rpctypes.ErrNoLeader, Unavailable},
		{rpctypes.ErrTimeout, Unavailable},
		{context.DeadlineExceeded, Unavailable},
		{fmt.Errorf("%w: x", ErrCompacted), Compacted},
	} {
		if got := ClassOf(classifyEtcd(fmt.Errorf("source: reading: %w", tc.err))); got != tc.want {
			t.Errorf("%v: %s, want %s", tc.err, got, tc.want)
		}
	}
}
