//go:build long

package campaign

import "testing"

// TestCampaign: seeds 1 to 24, the CI size (-seeds and -first choose
// others, e.g. -seeds 500 -timeout 0 for the large run).
func TestCampaign(t *testing.T) { campaign(t, 24) }

// TestGatewayCampaign runs the gateway scenarios of seeds 1-12 (see
// gatewayCampaign).
func TestGatewayCampaign(t *testing.T) { gatewayCampaign(t, 12) }
