package main

import (
	"os"
	"path/filepath"
	"testing"
)

// rewrite moves the names, and only them, in each kind of file it meets:
// the old package's own, a user of it, and the new package's own.
func TestRewrite(t *testing.T) {
	const oldP, newP = "example.com/m/dispatch", "example.com/m/gate"
	names := map[string]bool{"Permit": true, "Demand": true, "Lane": true, "Max": true}
	for _, c := range []struct{ name, in, want string }{
		{"the old package's own file", `package dispatch

import "time"

type attempt struct {
	permit Permit
	Lane   Lane // a field named like a moved type keeps its name
}

type Config struct{ Lane int }

func f(a *attempt, now time.Time) any {
	_ = Config{Lane: 1}
	_ = a.Lane
	m := map[string]Demand{}
	_ = map[any]int{Permit{}: 1}
	_ = map[int]int{Max: 1} // a map literal's key is a value
	return Permit{Demand: Demand{}, At: now}
}
`, `package dispatch

import (
	"time"

	"example.com/m/gate"
)

type attempt struct {
	permit gate.Permit
	Lane   gate.Lane // a field named like a moved type keeps its name
}

type Config struct{ Lane int }

func f(a *attempt, now time.Time) any {
	_ = Config{Lane: 1}
	_ = a.Lane
	m := map[string]gate.Demand{}
	_ = map[any]int{gate.Permit{}: 1}
	_ = map[int]int{gate.Max: 1} // a map literal's key is a value
	return gate.Permit{Demand: gate.Demand{}, At: now}
}
`},
		{"a user of the old package", `package shared

import (
	"fmt"

	"example.com/m/dispatch"
)

func g(p dispatch.Permit) dispatch.Permit { fmt.Println(); return p }
`, `package shared

import (
	"fmt"

	"example.com/m/gate"
)

func g(p gate.Permit) gate.Permit { fmt.Println(); return p }
`},
		{"a user that still needs the old package", `package runner

import "example.com/m/dispatch"

var _ dispatch.Config
var _ dispatch.Demand
`, `package runner

import (
	"example.com/m/dispatch"
	"example.com/m/gate"
)

var _ dispatch.Config
var _ gate.Demand
`},
		{"the new package's own file", `package gate

import "example.com/m/dispatch"

var _ dispatch.Permit
`, `package gate

var _ Permit
`},
	} {
		p := filepath.Join(t.TempDir(), "f.go")
		if err := os.WriteFile(p, []byte(c.in), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := rewrite(p, oldP, newP, names); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, _ := os.ReadFile(p)
		if string(got) != c.want {
			t.Errorf("%s:\n--- got\n%s--- want\n%s", c.name, got, c.want)
		}
	}
}
