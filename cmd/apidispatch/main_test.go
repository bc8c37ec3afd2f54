package main

import (
	"os"
	"testing"
)

// TestMain lets a test re-execute this test binary as the apidispatch
// command itself (APIDISPATCH_AS_CLI=1, arguments after "--"), so crash
// tests can kill -9 a real process.
func TestMain(m *testing.M) {
	if os.Getenv("APIDISPATCH_AS_CLI") == "1" {
		args := os.Args[1:]
		for i, a := range args {
			if a == "--" {
				args = args[i+1:]
				break
			}
		}
		os.Exit(mainCode(args, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
