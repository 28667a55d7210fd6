package slicectl

import (
	"context"
	"fmt"
	"maps"
	"strings"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/balance"
)

type jsonAlgorithmChange struct {
	Summary   string            `json:"summary"`
	Algorithm string            `json:"algorithm"`
	Params    map[string]string `json:"params"`
	Previous  struct {
		Algorithm string            `json:"algorithm"`
		Params    map[string]string `json:"params"`
	} `json:"previous"`
}

func newAlgorithmSetCommand(g *globalOptions) *cobra.Command {
	var (
		params []string
		keep   bool
	)
	cmd := &cobra.Command{
		Use:   "set NAME [--param NAME=VALUE]...",
		Short: "Choose the balancing algorithm and its constants",
		Long: `set makes the assigner balance with algorithm NAME and the constants --param
gives; the others take their defaults, unless --keep-params keeps those set now
(when NAME is the algorithm in force). The next pass uses them. The assigner
refuses an unknown algorithm, an unknown constant or a bad value, and then
nothing changes.

Algorithms: ` + strings.Join(balance.Names(), ", ") + `; slicectl sim --help lists their constants.`,
		Example: `  slicectl algorithm set weighted-move --param max_churn=0.05 --param dead_band=0.05
  slicectl algorithm set weighted-move --keep-params --param max_churn=0.02
  slicectl algorithm set consistent-hash`,
		Args: positional("NAME")(1),
		ValidArgsFunction: func(_ *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return balance.Names(), cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if name == "" {
				return usageError(fmt.Errorf("NAME is empty: want one of %s", strings.Join(balance.Names(), ", ")))
			}
			set, err := balance.ParseParams(params)
			if err != nil {
				return usageError(fmt.Errorf("--param: %w", err))
			}
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				return setAlgorithm(ctx, s, name, set, keep)
			})
		},
	}
	cmd.Flags().StringArrayVarP(&params, "param", "p", nil, "a constant as NAME=VALUE (repeatable)")
	cmd.Flags().BoolVar(&keep, "keep-params", false, "keep the constants set now, changing only those --param gives")
	_ = cmd.RegisterFlagCompletionFunc("param", func(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) == 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ps, _ := balance.Params(args[0])
		var out []cobra.Completion
		for _, p := range ps {
			out = append(out, cobra.CompletionWithDesc(p.Name+"=", p.Help))
		}
		return out, cobra.ShellCompDirectiveNoSpace | cobra.ShellCompDirectiveNoFileComp
	})
	return cmd
}

// setAlgorithm makes the assigner balance with algorithm name and the constants set (with
// keep, on top of those set now when name is in force), and prints what changed.
func setAlgorithm(ctx context.Context, s *session, name string, set map[string]string, keep bool) error {
	before, err := s.admin.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return err
	}
	if keep && before.GetAlgorithm() == name {
		merged := maps.Clone(before.GetParams())
		if merged == nil {
			merged = map[string]string{}
		}
		maps.Copy(merged, set)
		set = merged
	}
	if _, err := s.admin.SetAlgorithm(ctx, &pb.SetAlgorithmRequest{Name: name, Params: set}); err != nil {
		return err
	}
	out := jsonAlgorithmChange{Algorithm: name, Params: set}
	out.Previous.Algorithm, out.Previous.Params = before.GetAlgorithm(), before.GetParams()
	for _, m := range []*map[string]string{&out.Params, &out.Previous.Params} {
		if *m == nil {
			*m = map[string]string{}
		}
	}
	out.Summary = fmt.Sprintf("algorithm %s %s (was %s %s)", name, showParams(out.Params),
		out.Previous.Algorithm, showParams(out.Previous.Params))
	if !s.out.table() {
		return s.out.print(out)
	}
	_, err = fmt.Fprintln(s.out.w, out.Summary)
	return err
}
