// Package arch holds no code: its test checks the rules between the
// module's packages (which may import which), so that a change breaking
// the layering fails the build's tests rather than a later review.
package arch
