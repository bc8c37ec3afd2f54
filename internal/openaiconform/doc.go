// Package openaiconform holds the conformance test of the simulator's
// OpenAI surface against the official Go SDK (github.com/openai/openai-go/v3).
// It is a package of its own so that the SDK, a large build, is compiled
// only for this test and not for every test of package sim.
package openaiconform
