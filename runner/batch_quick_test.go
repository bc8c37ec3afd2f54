//go:build !long

package runner_test

import "testing"

// TestBatchRouteHalfPrice, quick: 600 items (-tags long: 3,000).
func TestBatchRouteHalfPrice(t *testing.T) { batchRouteHalfPrice(t, 600) }
