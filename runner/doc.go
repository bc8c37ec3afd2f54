// Package runner is a run's lifecycle, shared by every front door ('run',
// the A/B harness's arms, the projection of 'plan' and the gateway's batches):
// validate the input, project its cost and wall-clock (Project), apply the
// gates, open the run directory and the services beside the lanes (the
// shared budget and the metrics: StartServices), send the items by the
// chosen route (sync, batch, or auto's mix of both) and sum the run.
//
// Options go in (Config, Exec) and a typed result comes out: Run returns
// an Outcome whose Stop has a Kind callers switch on, and StopKind.ExitCode
// is the one place a stop becomes an exit code (docs/design.md §10). Errors of
// other front doors say their kind as a StopError, which StopOf reads.
// Everything Run starts (services, progress display, engines) it stops and
// waits for before it returns; an Aborter abandons the requests in flight
// from outside (the second signal). The command line only parses flags,
// wires signals and prints.
package runner
