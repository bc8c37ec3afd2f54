// Package rundir is a run directory: what every route (the sync engine,
// the batch route, the result cache, A/B's legacy arm) and every front door
// (run, ab, plan, the gateway) share about the place a run keeps its state.
//
// A run directory holds state.db (the store, opened here and nowhere
// else), results.jsonl, events.jsonl, summary.json, a lock held while a
// process runs in it, and the attempt journals of the processes that ran
// there. OpenJob validates an input and opens (or resumes) its directory;
// Sink is the one place an outcome becomes durable and then gets its
// results line; EventLog appends events; BuildSummary sums the store into
// summary.json and checks results.jsonl against it (the data-loss check);
// the Counter names are the figures a run keeps in its store beside its
// outcomes.
package rundir
