package slicectl

import (
	"context"
	"fmt"
	"maps"

	"github.com/spf13/cobra"

	pb "github.com/sliceplane/sliceplane/api/sliceplane/v1"
	"github.com/sliceplane/sliceplane/internal/balance"
)

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
