//go:build !race

package distributor_test

const raceEnabled = false
