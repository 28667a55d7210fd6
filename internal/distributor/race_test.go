//go:build race

package distributor_test

// raceEnabled: the race detector slows the data path about six times, so the integration
// scenarios shrink under it; `make test` also runs them at full size without it.
const raceEnabled = true
