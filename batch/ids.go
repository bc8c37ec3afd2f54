package batch

import (
	"crypto/rand"
	"encoding/base32"
	"errors"
	"strconv"
	"strings"

	"github.com/apidispatch/apidispatch/store"
)

// ErrNeedsPerson: a failure that would repeat on every resume (a batch
// whose results hold custom_ids it was not given, a batch the API has not
// known for an hour, a batch that has not ended long after its expiry);
// the error says what to look at. The run stops; its items stay held.
var ErrNeedsPerson = errors.New("batch: needs a person")

// prefixLen is the random part of a prefix: 12 base32 characters, 60 bits.
const prefixLen = 12

var lowerBase32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newPrefix returns a custom_id prefix for one batch: "ad" and 60 random
// bits, so that no other batch (of this run, another run, or a colleague)
// holds a custom_id that begins with it.
func newPrefix() string {
	var b [8]byte
	rand.Read(b[:])
	return "ad" + lowerBase32.EncodeToString(b[:])[:prefixLen]
}

// sentID is the custom_id item it is sent under in a batch of prefix p:
// p, "_", and the item's Seq (the item's own custom_id when p is empty, a
// batch recorded before prefixes). At most 34 characters, within the
// API's 64.
func sentID(p string, it store.Item) string {
	if p == "" {
		return it.CustomID
	}
	return p + "_" + strconv.FormatInt(it.Seq, 10)
}

// hasPrefix reports whether custom_id id was written for a batch of prefix
// p (non-empty).
func hasPrefix(p, id string) bool {
	return p != "" && strings.HasPrefix(id, p) && len(id) > len(p) && id[len(p)] == '_'
}
