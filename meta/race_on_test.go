//go:build race

package meta

// raceEnabled: the race detector slows the simulations about tenfold, so
// the start storm runs at a fifth of its size (its load ratio unchanged).
const raceEnabled = true
