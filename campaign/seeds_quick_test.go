//go:build !long

package campaign

import "testing"

// TestCampaign, quick: seeds 1 to 4 (-tags long: 1 to 24; -seeds and
// -first choose others).
func TestCampaign(t *testing.T) { campaign(t, 4) }

// gatewaySeeds is how many seeds TestGatewayCampaign runs by default.
const gatewaySeeds = 3
