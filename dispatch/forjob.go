package dispatch

import "github.com/apidispatch/apidispatch/rundir"

// NewForJob returns an engine for the run directory j: cfg's Store, Body,
// ResultsPath, Events and JournalDir are filled in from it.
func NewForJob(j *rundir.Job, cfg Config) (*Engine, error) {
	cfg.Store, cfg.Body, cfg.ResultsPath, cfg.Events, cfg.JournalDir = j.Store, j.Body, j.ResultsPath, j.Events, j.Dir
	return New(cfg)
}
