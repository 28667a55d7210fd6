package slicectl

import (
	"context"
	"fmt"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
)

// jsonFreeze is what freeze and unfreeze changed.
type jsonFreeze struct {
	Summary   string `json:"summary"`
	Frozen    bool   `json:"frozen"`
	WasFrozen bool   `json:"was_frozen"`
	Reason    string `json:"reason,omitempty"`
}

// setFrozen freezes or unfreezes balancing and says what changed.
func setFrozen(ctx context.Context, s *session, frozen bool, reason string) error {
	before, err := s.admin.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return err
	}
	if frozen {
		_, err = s.admin.Freeze(ctx, &pb.FreezeRequest{Reason: reason})
	} else {
		_, err = s.admin.Unfreeze(ctx, &pb.UnfreezeRequest{})
	}
	if err != nil {
		return err
	}
	out := jsonFreeze{Frozen: frozen, WasFrozen: before.GetFrozen(), Reason: reason}
	switch {
	case frozen && reason != "":
		out.Summary = fmt.Sprintf("balancing frozen: %s", reason)
	case frozen:
		out.Summary = "balancing frozen"
	default:
		out.Summary = "balancing resumed"
	}
	if out.WasFrozen == frozen {
		out.Summary += fmt.Sprintf(" (it was %s already)", map[bool]string{true: "frozen", false: "running"}[frozen])
	}
	if !s.out.table() {
		return s.out.print(out)
	}
	_, err = fmt.Fprintln(s.out.w, out.Summary)
	return err
}
