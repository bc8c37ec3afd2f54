//go:build !long

package campaign

import "testing"

// TestCampaign, quick: seeds 1 to 4 (-tags long: 1 to 24; -seeds and
// -first choose others).
func TestCampaign(t *testing.T) { campaign(t, 4) }

// TestGatewayCampaign runs the gateway scenarios of seeds 1-3 (see
// gatewayCampaign).
func TestGatewayCampaign(t *testing.T) { gatewayCampaign(t, 3) }
