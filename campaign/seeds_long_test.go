//go:build long

package campaign

import "testing"

// TestCampaign: seeds 1 to 12, the CI size (-seeds and -first choose
// others, e.g. -seeds 500 -timeout 0 for the large run). CI's 15 minutes
// hold the quick set under -race and the long tests after it; the large
// runs are the evidence (docs/campaign.md).
func TestCampaign(t *testing.T) { campaign(t, 12) }

// TestGatewayCampaign runs the gateway scenarios of seeds 1-6 (see
// gatewayCampaign).
func TestGatewayCampaign(t *testing.T) { gatewayCampaign(t, 6) }
