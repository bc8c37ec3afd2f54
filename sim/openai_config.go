package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// Providers an org may belong to (OrgConfig.Provider).
const (
	ProviderAnthropic = "anthropic"
	ProviderOpenAI    = "openai"
)

// OpenAILimits are one OpenAI org's per-minute limits for one model, in
// API units. A zero field is not limited.
type OpenAILimits struct {
	RPM int64 `json:"rpm"`
	TPM int64 `json:"tpm"`
	// BatchQueueTokens is the most prompt tokens the org may have enqueued
	// in unfinished batches for the model; a batch that would pass it
	// fails with token_limit_exceeded. Zero: DefaultOpenAIBatchQueueTokens.
	BatchQueueTokens int64 `json:"batch_queue_tokens,omitempty"`
}

// DefaultOpenAIBatchQueueTokens is the enqueued-token limit of a model
// whose limits do not set one.
const DefaultOpenAIBatchQueueTokens = 20_000_000

// isOpenAI reports whether the org is an OpenAI organisation.
func (o *OrgConfig) isOpenAI() bool { return o.Provider == ProviderOpenAI }

// checkProvider validates the provider-specific fields of an org.
func (o *OrgConfig) checkProvider() error {
	switch o.Provider {
	case "", ProviderAnthropic:
		if len(o.ModelLimits) > 0 || len(o.Projects) > 0 {
			return fmt.Errorf("model_limits and projects are for provider %q orgs", ProviderOpenAI)
		}
		return nil
	case ProviderOpenAI:
	default:
		return fmt.Errorf("provider %q: use %q or %q", o.Provider, ProviderAnthropic, ProviderOpenAI)
	}
	if len(o.Limits) > 0 {
		return fmt.Errorf("an openai org has model_limits, not limits")
	}
	for m, l := range o.ModelLimits {
		if l.RPM < 0 || l.TPM < 0 || l.BatchQueueTokens < 0 {
			return fmt.Errorf("model %q: limits must not be negative", m)
		}
		if m != "*" && oaModelByID[m] == nil {
			return fmt.Errorf("model_limits: unknown OpenAI model %q", m)
		}
	}
	for _, p := range o.Projects {
		if p == "" || strings.ContainsAny(p, " \t\r\n") {
			return fmt.Errorf("a project id is blank or holds whitespace")
		}
	}
	return nil
}

// openAIDefaults fills an OpenAI org's id ("org-" and 24 letters and
// digits), key ("sk-proj-sim-<name>-<hex>") and project from the seed.
func (o *OrgConfig) openAIDefaults(seed int64) {
	sum := sha256.Sum256([]byte("openai-org/" + strconv.FormatInt(seed, 10) + "/" + o.Name))
	if o.ID == "" {
		var b [24]byte
		for i := range b {
			b[i] = idAlphabet[sum[i]%62]
		}
		o.ID = "org-" + string(b[:])
	}
	if len(o.Keys) == 0 {
		k := sha256.Sum256([]byte("openai-key/" + strconv.FormatInt(seed, 10) + "/" + o.Name))
		o.Keys = []string{"sk-proj-sim-" + o.Name + "-" + hex.EncodeToString(k[:12])}
	}
	if len(o.Projects) == 0 {
		o.Projects = []string{"proj_" + hex.EncodeToString(sum[24:32])}
	}
}

// OpenAIOrg is an OpenAI org as a client configures it.
type OpenAIOrg struct {
	Name     string
	ID       string // "org-…", the OpenAI-Organization value
	Key      string // the first key
	Projects []string
}

// OpenAIOrgs returns the simulator's OpenAI orgs, in configuration order.
func (s *Server) OpenAIOrgs() []OpenAIOrg {
	var out []OpenAIOrg
	for i, o := range s.orgs {
		if o.oa != nil && len(o.keys) > 0 {
			out = append(out, OpenAIOrg{Name: o.name, ID: o.id, Key: o.keys[0].secret, Projects: append([]string(nil), s.cfg.Orgs[i].Projects...)})
		}
	}
	return out
}
