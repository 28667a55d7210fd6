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

func newAlgorithmCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "algorithm",
		Short: "Show or choose the balancing algorithm and its constants",
		Long: `algorithm shows the balancing algorithm the assigner runs, with its constants,
or chooses another one or other constants. The choice is stored with the map
and survives a failover.

Algorithms: ` + strings.Join(balance.Names(), ", ") + `.
slicectl sim --help lists every algorithm's constants with their defaults; sim
compares algorithms and constants offline before you set them here.`,
		Example: `  slicectl algorithm show
  slicectl algorithm set weighted-move --param max_churn=0.05 --param dead_band=0.05
  slicectl algorithm set consistent-hash`,
		Args: cobra.ArbitraryArgs,
		RunE: helpOrUnknown,
	}
	cmd.AddCommand(newAlgorithmShowCommand(g), newAlgorithmSetCommand(g))
	return cmd
}

// jsonParam is one constant of an algorithm: its value in force, its default, and whether
// it is set rather than left at the default.
type jsonParam struct {
	Name    string `json:"name"`
	Value   string `json:"value"`
	Default string `json:"default"`
	Set     bool   `json:"set"`
	Help    string `json:"help"`
}

type jsonAlgorithm struct {
	Algorithm string            `json:"algorithm"`
	Params    map[string]string `json:"params"`
	// Constants lists every constant of the algorithm as this slicectl knows it.
	Constants []jsonParam `json:"constants"`
}

func algorithmJSON(name string, params map[string]string) jsonAlgorithm {
	out := jsonAlgorithm{Algorithm: name, Params: maps.Clone(params), Constants: []jsonParam{}}
	if out.Params == nil {
		out.Params = map[string]string{}
	}
	known, _ := balance.Params(name) // an algorithm this slicectl does not know has no list
	for _, p := range known {
		v, set := params[p.Name]
		if !set {
			v = p.Default
		}
		out.Constants = append(out.Constants, jsonParam{Name: p.Name, Value: v, Default: p.Default, Set: set, Help: p.Help})
	}
	return out
}

func newAlgorithmShowCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "show",
		Short: "Show the balancing algorithm and its constants",
		Long: `show prints the balancing algorithm the assigner runs and every one of its
constants: the value in force, marked "set" when it was chosen rather than left
at its default, and what it does.`,
		Example: `  slicectl algorithm show
  slicectl algorithm show -o json | jq '.constants[] | select(.set)'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withAssigner(cmd, func(ctx context.Context, s *session) error {
				st, err := s.admin.Status(ctx, &pb.StatusRequest{})
				if err != nil {
					return err
				}
				out := algorithmJSON(st.GetAlgorithm(), st.GetParams())
				if !s.out.table() {
					return s.out.print(out)
				}
				fmt.Fprintf(s.out.w, "algorithm %s: %s\n", out.Algorithm, balance.Help(out.Algorithm))
				if len(out.Constants) == 0 {
					_, err := fmt.Fprintln(s.out.w, "constants:", showParams(out.Params))
					return err
				}
				w := newTable(s.out.w)
				row(w, "CONSTANT", "VALUE", "DEFAULT", "", "MEANING")
				for _, p := range out.Constants {
					set := ""
					if p.Set {
						set = "set"
					}
					row(w, p.Name, p.Value, p.Default, set, p.Help)
				}
				return w.Flush()
			})
		},
	}
}

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
