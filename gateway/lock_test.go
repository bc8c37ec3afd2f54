package gateway

import (
	"errors"
	"testing"
)

// Two gateways on one state directory would each allow a client its
// max_cost: the second is refused while the first holds the lock.
func TestStateDirLock(t *testing.T) {
	dir := t.TempDir()
	l, err := lockStateDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockStateDir(dir); !errors.Is(err, ErrStateDirBusy) {
		t.Fatalf("a second lock of the state directory: %v, want ErrStateDirBusy", err)
	}
	l.Close()
	l2, err := lockStateDir(dir)
	if err != nil {
		t.Fatalf("lock not released by close: %v", err)
	}
	l2.Close()
}
