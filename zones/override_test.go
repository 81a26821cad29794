package zones

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

func mustPlan(t *testing.T, events int64, window time.Duration) Plan {
	t.Helper()
	p, err := NewPlan(events, window, 0)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOverridePrecedence(t *testing.T) {
	now := time.Now().UnixNano()
	p := func(n int64) Plan { return mustPlan(t, n, time.Minute) }
	set, err := NewOverrideSet([]*Override{
		{ID: "k", Key: "cust-42", Plan: p(1)},
		{ID: "p1", Prefix: "cust-", Plan: p(2)},
		{ID: "p2", Prefix: "cust-4", Plan: p(3)},
		{ID: "c16", CIDR: netip.MustParsePrefix("10.1.0.0/16"), Plan: p(4)},
		{ID: "c24", CIDR: netip.MustParsePrefix("10.1.2.0/24"), Plan: p(5)},
		{ID: "c6", CIDR: netip.MustParsePrefix("2001:db8::/32"), Exempt: true},
		{ID: "gone", Key: "old", Deny: true, Expires: now - 1},
		{ID: "gonep", Prefix: "ol", Plan: p(6)},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ key, want string }{
		{"cust-42", "k"},
		{"cust-43", "p2"},
		{"cust-5", "p1"},
		{"cust", ""},
		{"10.1.2.3", "c24"},
		{"10.1.2.0/24", "c24"},
		{"10.1.3.0/24", "c16"},
		{"10.1.0.0/8", ""}, // wider than every CIDR: not covered
		{"10.2.0.1", ""},
		{"2001:db8::1", "c6"},
		{"::ffff:10.1.2.3", "c24"},
		{"old", "gonep"}, // the exact override lapsed: the prefix applies
		{"", ""},
	} {
		got := ""
		if o := set.Lookup(c.key, now); o != nil {
			got = o.ID
		}
		if got != c.want {
			t.Errorf("Lookup(%q) = %q, want %q", c.key, got, c.want)
		}
	}
	if _, err := NewOverrideSet([]*Override{{ID: "x"}}); err == nil {
		t.Error("an override matching nothing was accepted")
	}
	if _, err := NewOverrideSet([]*Override{{ID: "x", Key: "a", Prefix: "b"}}); err == nil {
		t.Error("an override with two matches was accepted")
	}
}

// TestOverrideCarriesKeyState: a key that spent all of 5/min has none of
// 50/min at once and one more every 1.2s; dropping the override puts it
// back under 5/min with its debt.
func TestOverrideCarriesKeyState(t *testing.T) {
	c := Config{Name: "z", Events: 5, Window: time.Minute}
	state := NewState(c, time.Hour)
	defer state.Destruct()
	z, err := New(c, state, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ov Overrides
	z.UseOverrides(&ov)
	ctx := context.Background()
	now := int64(1e12)
	admit := func(at int64) Ticket[int] {
		tk := Ticket[int]{Zone: z, Key: "k", Plan: z.Plan(), Cost: 1}
		tk.Resolve()
		tk.Admit(ctx, at)
		return tk
	}
	for i := range 5 {
		if tk := admit(now); !tk.Allowed {
			t.Fatalf("request %d denied", i)
		}
	}
	if admit(now).Allowed {
		t.Fatal("6th request allowed")
	}
	set, _ := NewOverrideSet([]*Override{{ID: "raise", Key: "k", Plan: mustPlan(t, 50, time.Minute)}})
	ov.Store(set)
	if tk := admit(now); tk.Allowed {
		t.Fatalf("a raise gave a key with no quota a fresh bucket: %+v", tk.Decision)
	}
	later := now + int64(5*time.Second)
	got := 0
	for admit(later).Allowed {
		got++
	}
	if got != 4 { // 5 s at one per 1.2 s
		t.Errorf("after 5 s under 50/min: %d admitted, want 4", got)
	}
	ov.Store(nil)
	if tk := admit(later); tk.Allowed || tk.Plan.Events != 5 {
		t.Errorf("after the override went: %+v under %d/min, want denied under 5", tk.Decision, tk.Plan.Events)
	}

	deny, _ := NewOverrideSet([]*Override{{ID: "d", Key: "j", Deny: true, Expires: time.Now().Add(time.Minute).UnixNano()}, {ID: "e", Key: "k", Exempt: true}})
	ov.Store(deny)
	for range 20 {
		if tk := admit(later); !tk.Allowed || tk.Remaining != 5 {
			t.Fatalf("exempt key: %+v", tk.Decision)
		}
	}
	tk := Ticket[int]{Zone: z, Key: "j", Plan: z.Plan(), Cost: 1}
	tk.Resolve()
	tk.Admit(ctx, later)
	if tk.Allowed || tk.RetryAfter < 50*time.Second || tk.RetryAfter > time.Minute {
		t.Errorf("deny override: %+v, want denied until it expires (~1m)", tk.Decision)
	}
	ov.Store(nil)
	if tk := admit(later); tk.Allowed {
		t.Error("exempt requests consumed nothing, yet the key is still in debt: want denied")
	}
}

// TestOverridesConcurrentSwapAndLookup: lookups from many goroutines while
// sets are swapped see either set, whole.
func TestOverridesConcurrentSwapAndLookup(t *testing.T) {
	var ov Overrides
	c := Config{Name: "z", Events: 5, Window: time.Minute}
	state := NewState(c, time.Hour)
	defer state.Destruct()
	z, _ := New(c, state, nil)
	z.UseOverrides(&ov)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("k%d", (g+i)%50)
				// A set once loaded never changes under its reader.
				if s := ov.Load(); s != nil {
					now := time.Now().UnixNano()
					n, a := s.Len(), s.Lookup(key, now)
					if m, b := s.Len(), s.Lookup(key, now); m != n || a != b {
						t.Errorf("a loaded set changed: %d overrides then %d, %+v then %+v for %q", n, m, a, b, key)
						return
					}
				}
				if o := z.Override(key); o != nil && o.Key != key && o.Prefix != "k" {
					t.Errorf("override %+v for %q", o, key)
					return
				}
				_ = z.LastPlan(key, 0)
			}
		}()
	}
	// Changes flow one at a time, as a holder applies them: each makes a
	// new set from the one readers hold.
	for i := range 2000 {
		id := fmt.Sprint(i % 60)
		switch s := ov.Load(); {
		case i%5 == 4:
			ov.Store(s.Without(id))
		case i%7 == 0:
			next, err := s.With(&Override{ID: id, Prefix: "k", Exempt: true}, int64(i))
			if err != nil {
				t.Fatal(err)
			}
			ov.Store(next)
		default:
			next, err := s.With(&Override{ID: id, Key: fmt.Sprintf("k%d", i%50), Plan: mustPlan(t, int64(i%9+1), time.Minute)}, int64(i))
			if err != nil {
				t.Fatal(err)
			}
			ov.Store(next)
		}
	}
	close(stop)
	wg.Wait()
}

func BenchmarkOverrideLookup10kPrefixes(b *testing.B) {
	var list []*Override
	for i := range MaxOverrides {
		list = append(list, &Override{ID: fmt.Sprint(i), Prefix: fmt.Sprintf("tenant-%05d-", i), Exempt: true})
	}
	s, _ := NewOverrideSet(list)
	now := time.Now().UnixNano()
	b.ReportAllocs()
	for b.Loop() {
		_ = s.Lookup("tenant-04242-key", now)
	}
}

// An expired override is passed over whatever its match: a lapsed prefix
// or CIDR gives way to the next one in force.
func TestExpiredPrefixAndCIDROverridesAreNotApplied(t *testing.T) {
	now := time.Now().UnixNano()
	set, err := NewOverrideSet([]*Override{
		{ID: "p-old", Prefix: "acme-", Deny: true, Expires: now - 1},
		{ID: "p-live", Prefix: "ac", Exempt: true},
		{ID: "c-old", CIDR: netip.MustParsePrefix("10.1.0.0/16"), Deny: true, Expires: now},
		{ID: "c-live", CIDR: netip.MustParsePrefix("10.0.0.0/8"), Exempt: true},
		{ID: "c6-old", CIDR: netip.MustParsePrefix("2001:db8::/32"), Deny: true, Expires: now - 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"acme-1": "p-live", "10.1.2.3": "c-live", "2001:db8::1": ""} {
		got := ""
		if o := set.Lookup(key, now); o != nil {
			got = o.ID
		}
		if got != want {
			t.Errorf("Lookup(%s) = %q, want %q (an expired override passed over)", key, got, want)
		}
	}
}

// A prefix covers a key longer than MaxKeyLength, which is stored hashed:
// it matches the key as built.
func TestPrefixOverrideCoversAHashedKey(t *testing.T) {
	c := Config{Name: "z", Events: 2, Window: time.Second}
	z := mustNew(c, newTestState(t, c), nil)
	var ov Overrides
	set, err := NewOverrideSet([]*Override{{ID: "acme", Prefix: "acme-", Deny: true}})
	if err != nil {
		t.Fatal(err)
	}
	ov.Store(set)
	z.UseOverrides(&ov)
	raw := "acme-" + strings.Repeat("x", MaxKeyLength)
	key := c.Key(raw)
	if !strings.HasPrefix(key, HashedKeyPrefix) {
		t.Fatalf("a %d-byte key is stored as %q, not hashed", len(raw), key)
	}
	tk := Ticket[int]{Zone: z, Key: key, Raw: raw}
	tk.Resolve()
	if tk.Override == nil || tk.Override.ID != "acme" {
		t.Fatalf("the prefix override does not cover the hashed key: %+v", tk.Override)
	}
}

// deny_while's question honours an override as a request does: an exempt
// key is never denied there, even with its burst spent, and a denied key
// always is.
func TestDeniesHonoursExemptAndDenyOverrides(t *testing.T) {
	c := Config{Name: "z", Events: 1, Window: time.Minute}
	z := mustNew(c, newTestState(t, c), nil)
	now := monotime.Now()
	z.Decide(context.Background(), "spent", now)
	if !z.Denies("spent", now) {
		t.Fatal("a spent key is not denied")
	}
	var ov Overrides
	set, err := NewOverrideSet([]*Override{{ID: "free", Key: "spent", Exempt: true}, {ID: "shut", Key: "fresh", Deny: true}})
	if err != nil {
		t.Fatal(err)
	}
	ov.Store(set)
	z.UseOverrides(&ov)
	if z.Denies("spent", now) {
		t.Error("an exempt key with its burst spent is denied")
	}
	if !z.Denies("fresh", now) {
		t.Error("a key under a deny override is not denied")
	}
}

// A set changed one override at a time answers every lookup as a set
// built whole from the same overrides in any order: replacing, removing
// and two overrides of one match (the latest change wins) included.
func TestOverrideSetChangesMatchASetBuiltWhole(t *testing.T) {
	keys := []string{"a", "b", "ab", "abc", "10.1.2.3", "10.1.9.9", "2001:db8::1", "zz"}
	match := func(i int) Override {
		switch i % 6 {
		case 0:
			return Override{Key: keys[i/6%len(keys)]}
		case 1, 2:
			return Override{Prefix: []string{"a", "ab", "z", "10."}[i%4]}
		case 3:
			return Override{CIDR: netip.MustParsePrefix([]string{"10.1.0.0/16", "10.1.2.0/24", "2001:db8::/32", "10.0.0.0/8"}[i%4])}
		}
		return Override{Key: fmt.Sprintf("k%d", i)}
	}
	type change struct {
		version int64
		o       *Override
	}
	live := map[string]change{}
	var s *OverrideSet
	now := time.Now().UnixNano()
	for i := range 6000 {
		id := fmt.Sprint(i * 7919 % 1500) // revisits ids: replaces and removes
		if i%4 == 3 {
			s = s.Without(id)
			delete(live, id)
		} else {
			o := match(i * 31)
			o.ID, o.Exempt = id, true
			if i%9 == 0 {
				o.Expires = now - 1
			}
			next, err := s.With(&o, int64(i))
			if err != nil {
				t.Fatal(err)
			}
			s = next
			live[id] = change{int64(i), &o}
		}
		if i%50 != 0 {
			continue
		}
		// Built whole, latest change first: the version decides, not the
		// order of insertion.
		order := make([]change, 0, len(live))
		for _, c := range live {
			order = append(order, c)
		}
		slices.SortFunc(order, func(a, b change) int { return cmp.Compare(b.version, a.version) })
		var whole *OverrideSet
		for _, c := range order {
			var err error
			if whole, err = whole.With(c.o, c.version); err != nil {
				t.Fatal(err)
			}
		}
		if s.Len() != whole.Len() || s.Len() != len(live) {
			t.Fatalf("after %d changes: the set holds %d, one built whole %d, want %d", i+1, s.Len(), whole.Len(), len(live))
		}
		for _, k := range append(keys, "k31", "k62", "abd", "10.200.0.1") {
			if s == nil {
				break
			}
			if got, want := s.Lookup(k, now), whole.Lookup(k, now); got != want {
				t.Fatalf("after %d changes, %q: %+v, a set built whole says %+v", i+1, k, got, want)
			}
		}
	}
}

// The trie holds what a map holds through any run of puts and deletes,
// leaves split and emptied branches included, and a change leaves the
// trie it was made from as it was.
func TestTrieMatchesAMap(t *testing.T) {
	var tr *trie[string, int]
	want := map[string]int{}
	hash := func(k string) uint64 {
		if len(k)%2 == 0 {
			return hashString(k) & 0xfff // collide down to a spent hash
		}
		return hashString(k)
	}
	for i := range 40000 {
		k := fmt.Sprint(i * 104729 % 9000)
		h := hash(k)
		before, had := tr.lookup(h, k)
		prev := tr
		if i%3 == 2 {
			tr = tr.set(0, h, k, nil)
			delete(want, k)
		} else {
			tr = tr.set(0, h, k, &i)
			want[k] = i
		}
		if v, ok := prev.lookup(h, k); v != before || ok != had {
			t.Fatalf("change %d of %q altered the trie it was made from", i, k)
		}
		if i%1000 == 0 || i > 39000 {
			for k, v := range want {
				if got, ok := tr.lookup(hash(k), k); !ok || got != v {
					t.Fatalf("after %d changes, %q: %d %v, want %d", i+1, k, got, ok, v)
				}
			}
		}
	}
	if _, ok := tr.lookup(hash("absent"), "absent"); ok {
		t.Error("a key never put is found")
	}
}

// Of two overrides of one match, the one changed last is in force until it
// lapses, then the earlier one again (not the zone's limit until a sweep).
func TestLapsedOverrideGivesWayToAnEarlierOfTheSameMatch(t *testing.T) {
	now := time.Now().UnixNano()
	set, err := NewOverrideSet([]*Override{
		{ID: "key-plan", Key: "k", Plan: mustPlan(t, 5, time.Minute)},
		{ID: "key-deny", Key: "k", Deny: true, Expires: now},
		{ID: "pfx-plan", Prefix: "acme-", Plan: mustPlan(t, 5, time.Minute)},
		{ID: "pfx-deny", Prefix: "acme-", Deny: true, Expires: now},
		{ID: "cidr-plan", CIDR: netip.MustParsePrefix("10.0.0.0/8"), Plan: mustPlan(t, 5, time.Minute)},
		{ID: "cidr-deny", CIDR: netip.MustParsePrefix("10.0.0.0/8"), Deny: true, Expires: now},
	})
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"k": "key-plan", "acme-1": "pfx-plan", "10.1.2.3": "cidr-plan"} {
		for at, w := range map[int64]string{now - 1: strings.Replace(want, "plan", "deny", 1), now: want} {
			got := ""
			if o := set.Lookup(key, at); o != nil {
				got = o.ID
			}
			if got != w {
				t.Errorf("Lookup(%s) at expiry%+d = %q, want %q", key, at-now, got, w)
			}
		}
	}
}

// A lookup allocates nothing: a key that is not an address is not parsed as
// one (a parse error allocates). Only an address in another spelling than
// its canonical one costs the canonical string, to be looked up too.
func TestOverrideLookupAllocatesNothing(t *testing.T) {
	set, _ := NewOverrideSet([]*Override{
		{ID: "ip", Key: "2001:db8::5", Deny: true},
		{ID: "net", CIDR: netip.MustParsePrefix("10.0.0.0/8"), Exempt: true},
		{ID: "p", Prefix: "team-", Exempt: true},
	})
	now := time.Now().UnixNano()
	for key, want := range map[string]string{"user:1": "", "sha256:abcdef": "", "alice": "", "team-a": "p",
		"10.1.2.3": "net", "10.1.2.0/24": "net", "2001:db8::5": "ip", "2001:DB8::5": "ip", "2001:db8::6": ""} {
		got := ""
		if o := set.Lookup(key, now); o != nil {
			got = o.ID
		}
		if got != want {
			t.Errorf("Lookup(%s) = %q, want %q", key, got, want)
		}
		if n := testing.AllocsPerRun(100, func() { _ = set.Lookup(key, now) }); n != 0 && key != "2001:DB8::5" {
			t.Errorf("Lookup(%s) allocates %v times", key, n)
		}
	}
}
