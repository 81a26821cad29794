package distributed

import (
	"strings"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/algorithms"
)

func TestScaleSplitsRateAndBurstByShare(t *testing.T) {
	l := algorithms.NewLimit(600, int64(time.Minute), 20) // T = 100 ms
	for _, c := range []struct {
		share    int64
		interval int64
		burst    int64
	}{
		{ShareScale, int64(100 * time.Millisecond), 20},
		{ShareScale / 2, int64(200 * time.Millisecond), 10},
		{ShareScale / 4, int64(400 * time.Millisecond), 5},
		{ShareScale / 20, int64(2 * time.Second), 1},
		{ShareScale / 100, int64(10 * time.Second), 1}, // a burst of 0 would admit nothing
	} {
		got := Scale(l, c.share)
		if got.EmissionInterval != c.interval || got.Burst != c.burst {
			t.Errorf("Scale(share %d) = T %v, burst %d; want T %v, burst %d", c.share,
				time.Duration(got.EmissionInterval), got.Burst, time.Duration(c.interval), c.burst)
		}
	}
}

func TestRegionOptionsNameTheFix(t *testing.T) {
	ok := RegionOptions{Region: "eu", Regions: []RegionWeight{{"eu", 2}, {"us", 1}}, SyncInterval: time.Second, Lease: time.Minute}
	if err := ok.Check(); err != nil {
		t.Fatal(err)
	}
	if d := ok.withDefaults().Refresh; d != 10*time.Second {
		t.Errorf("default refresh %v, want 10 × sync_interval (10s)", d)
	}
	if d := (RegionOptions{SyncInterval: time.Second, Lease: 4 * time.Second}).withDefaults().Refresh; d != 2*time.Second {
		t.Errorf("default refresh with lease 4s: %v, want half the lease (2s)", d)
	}
	for _, c := range []struct {
		change func(*RegionOptions)
		want   string
	}{
		{func(o *RegionOptions) { o.Region = "ap" }, "region ap is not one of the global block's regions (eu, us)"},
		{func(o *RegionOptions) { o.Region = "" }, "a region is required"},
		{func(o *RegionOptions) { o.Regions[1].Weight = 0 }, "weight must be a whole number from 1"},
		{func(o *RegionOptions) { o.Lease = time.Second }, "lease 1s is shorter than twice sync_interval 1s: use lease 2s or more"},
		{func(o *RegionOptions) { o.Regions = nil }, "regions is required"},
		{func(o *RegionOptions) { o.Refresh = time.Hour }, "refresh 1h0m0s must be from sync_interval 1s to half the lease 30s"},
		{func(o *RegionOptions) { o.Refresh = time.Millisecond }, "refresh 1ms must be from sync_interval 1s"},
	} {
		o := ok
		o.Regions = append([]RegionWeight(nil), ok.Regions...)
		c.change(&o)
		if err := o.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Check() = %v, want it to contain %q", err, c.want)
		}
	}
}

// A zone stays in the region while any handler that wrapped it lives, and
// leaves with the last (a reload that drops it from the config): its
// regional keys are no longer in the polls' and syncs' calls.
func TestReleaseZoneRemovesAZoneWithItsLastUser(t *testing.T) {
	r := &Region{zones: map[string]*regionZone{}, prefix: "tally:"}
	l := algorithms.NewLimit(600, int64(time.Minute), 20)
	r.AddZone("api", l)
	r.AddZone("login", l)
	r.AddZone("api", l) // the reloaded config's handler, before the old one's cleanup
	r.ReleaseZone("api")
	if got := len(r.set.Load().zones); got != 2 || r.zone("api") == nil {
		t.Fatalf("after one of api's two users left: %d zones, api %v; want both zones", got, r.zone("api"))
	}
	r.ReleaseZone("api")
	set := r.set.Load()
	if len(set.zones) != 1 || set.zones[0].name != "login" || r.zone("api") != nil {
		t.Fatalf("after api's last user left: zones %v", set.zones)
	}
	want := []string{"tally:global{r}.meta", "tally:global{r}.lock", "tally:global{r}.demand:login", "tally:global{r}.shares:login"}
	if strings.Join(set.keys, " ") != strings.Join(want, " ") {
		t.Errorf("region.lua's keys %v, want %v", set.keys, want)
	}
	r.ReleaseZone("api") // once more: nothing to release
	r.ReleaseZone("login")
	if set := r.set.Load(); len(set.zones) != 0 || len(set.keys) != 2 {
		t.Errorf("with no zones left: %v %v", set.zones, set.keys)
	}
}
