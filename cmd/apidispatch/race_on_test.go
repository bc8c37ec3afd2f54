//go:build race

package main

// The soak runs fewer items under the race detector (see soak_test.go).
func init() { raceBuild = true }
