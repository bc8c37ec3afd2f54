//go:build !long

package main

import "testing"

// TestKillNineThenResume, quick: four kills in one 2,000-item run (-tags
// long runs the twenty kills in 20,000 items; APIDISPATCH_KILL_N
// and APIDISPATCH_KILLS override either).
func TestKillNineThenResume(t *testing.T) { killNineThenResume(t, 2_000, 4) }
