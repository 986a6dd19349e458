package coordinator

import (
	"fmt"
	"testing"
)

// Rendezvous placement spreads names evenly over clusters, even clusters
// whose names differ in one byte, and a cluster added later takes names
// only for itself: no name moves between the clusters that were there.
func TestRendezvousSpreadsAndMovesOnlyToTheNewCluster(t *testing.T) {
	old := []string{"a", "b", "c"}
	grown := append(old, "d")
	const n = 3000
	count := map[string]int{}
	for i := range n {
		key := fmt.Sprintf("sku-%d", i)
		was, now := rendezvous(old, key), rendezvous(grown, key)
		count[was]++
		if now != was && now != "d" {
			t.Fatalf("%s moved from %s to %s when d was added", key, was, now)
		}
	}
	for _, c := range old {
		if count[c] < n/4 || count[c] > n*5/12 {
			t.Fatalf("placement over %v: %v, want about %d each", old, count, n/3)
		}
	}
}
