package slicectl

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
)

// jsonPassFailures says whether balancing passes are failing: how many in a row (0 once one
// succeeds), and why and when the last failed one did.
type jsonPassFailures struct {
	PassFailures  uint64     `json:"pass_failures"`
	PassError     string     `json:"pass_error,omitempty"`
	PassErrorTime *time.Time `json:"pass_error_time,omitempty"`
}

// showPassFailures says that passes are failing, or "" when the last one succeeded.
func showPassFailures(n uint64, why string, at *timestamppb.Timestamp) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("FAILING: %d passes in a row, the last %s: %s (only the clean-up of departed nodes runs)",
		n, showTime(at, time.Now()), why)
}
