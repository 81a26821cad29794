package distributed

import "testing"

// hashSlot agrees with Redis Cluster's key slots (CLUSTER KEYSLOT), hash
// tags included: the batcher puts keys of one slot in one script call.
func TestHashSlot(t *testing.T) {
	for key, want := range map[string]int{
		"123456789":            12739, // the CRC16/XMODEM check value 0x31C3
		"foo":                  12182,
		"bar":                  5061,
		"{user1000}.following": 3443,
		"{user1000}.followers": 3443,
		"user1000":             3443,
		"foo{}{bar}":           8363, // an empty tag: the whole key
		"foo{{bar}}zap":        4015, // the tag is "{bar"
		"":                     0,
	} {
		if got := hashSlot(key); got != want {
			t.Errorf("hashSlot(%q) = %d, want %d", key, got, want)
		}
	}
}
