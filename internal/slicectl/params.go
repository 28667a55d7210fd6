package slicectl

import (
	"maps"
	"slices"
	"strings"
)

// showParams writes an algorithm's constants as k=v, sorted, or "defaults".
func showParams(params map[string]string) string {
	if len(params) == 0 {
		return "(default constants)"
	}
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(params)) {
		kv = append(kv, k+"="+params[k])
	}
	return strings.Join(kv, " ")
}
