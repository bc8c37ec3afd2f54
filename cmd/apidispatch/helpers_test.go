package main

// raceBuild is set by race_on_test.go when the tests are built with -race.
var raceBuild bool

// tail is the last 4 KiB of s, for failure messages.
func tail(s string) string {
	if len(s) > 4096 {
		return "…" + s[len(s)-4096:]
	}
	return s
}
