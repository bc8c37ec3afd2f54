//go:build long

package campaign

import "testing"

// TestCampaign: seeds 1 to 24, the CI size (-seeds and -first choose
// others, e.g. -seeds 500 -timeout 0 for the large run).
func TestCampaign(t *testing.T) { campaign(t, 24) }

// gatewaySeeds is how many seeds TestGatewayCampaign runs by default.
const gatewaySeeds = 12
