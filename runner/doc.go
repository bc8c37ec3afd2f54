// Package runner is a run's lifecycle, shared by 'apidispatch run' and the
// A/B harness: validate the input, project its cost and wall-clock, apply
// the gates, open the run directory, send the items by the chosen route
// (sync, batch, or auto's mix of both) and sum the run. The command line
// only parses flags, wires signals and prints.
package runner
