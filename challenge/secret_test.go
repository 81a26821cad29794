package challenge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

// The secret is created once in the storage, shared by every instance
// that loads it, and rotated with an overlap: a cookie signed by the
// replaced key still verifies.
func TestSecretsSharedAndRotatedWithOverlap(t *testing.T) {
	ctx := context.Background()
	st := &certmagic.FileStorage{Path: t.TempDir()}
	a, err := LoadSecrets(ctx, st, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadSecrets(ctx, st, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	cookie, id := a.Mint("visitors", now.Add(time.Hour))
	if got, ok, _ := b.Identity("visitors", cookie, now); !ok || got != id {
		t.Fatalf("an instance sharing the storage: Identity = %q, %v; want %q", got, ok, id)
	}

	// Age the key past the rotation period: the next load replaces it
	// and keeps it as the previous key.
	raw, _ := st.Load(ctx, StorageKey)
	var stored []secret
	_ = json.Unmarshal(raw, &stored)
	stored[0].Created = now.Add(-MinRotation - time.Minute)
	raw, _ = json.Marshal(stored)
	_ = st.Store(ctx, StorageKey, raw)
	rotated, err := LoadSecrets(ctx, st, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if keys := *rotated.keys.Load(); len(keys) != 2 || !bytes.Equal(keys[1].ID, a.current().ID) {
		t.Fatalf("after a rotation: %d keys, want the new one and the replaced one", len(keys))
	}
	if got, ok, _ := rotated.Identity("visitors", cookie, now); !ok || got != id {
		t.Errorf("a cookie signed just before the rotation: Identity = %q, %v; want %q", got, ok, id)
	}
	// The instance that loaded before the rotation learns the new key
	// from the storage when a cookie names it.
	fresh, freshID := rotated.Mint("visitors", now.Add(time.Hour))
	if got, ok, _ := a.Identity("visitors", fresh, now); !ok || got != freshID {
		t.Errorf("a cookie signed by the rotated key, on an instance loaded before: Identity = %q, %v; want %q", got, ok, freshID)
	}
}

// Issuing, verifying, minting and reading cookies, and the pressure, from
// many goroutines at once (run with -race).
func TestChallengeConcurrently(t *testing.T) {
	st := &certmagic.FileStorage{Path: t.TempDir()}
	s, err := LoadSecrets(context.Background(), st, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := &Pressure{Min: 1, Max: 3}
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "10.0.0." + strconv.Itoa(g%4)
			for range 50 {
				now := time.Now()
				d := p.Next(key, now)
				tok := s.Issue("visitors", key, d, now, time.Minute)
				if _, r := s.Verify(tok, key, Solve(tok, d), now); r != "" {
					t.Errorf("a solved challenge: %s", r)
					return
				}
				v, id := s.Mint("visitors", now.Add(time.Minute))
				if got, ok, _ := s.Identity("visitors", v, now); !ok || got != id {
					t.Errorf("a fresh cookie: %q %v", got, ok)
					return
				}
				var unknown [keyIDLen]byte
				unknown[0] = byte(g)
				s.byID(unknown[:]) // an unknown key id: at most one reload at a time
			}
		}()
	}
	wg.Wait()
}

// loadAt loads st's secrets with a clock the test moves.
func loadAt(t *testing.T, st Storage, clock *atomic.Int64) *Secrets {
	t.Helper()
	s, err := LoadSecrets(context.Background(), st, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s.now = func() time.Time { return time.Unix(0, clock.Load()) }
	return s
}

// settled waits for the rotation a signing may have started.
func settled(s *Secrets) *Secrets {
	s.rotating.Lock()
	defer s.rotating.Unlock()
	return s
}

func storedKeys(t *testing.T, st Storage) []secret {
	t.Helper()
	raw, err := st.Load(context.Background(), StorageKey)
	var keys []secret
	if err == nil {
		err = json.Unmarshal(raw, &keys)
	}
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// A running instance rotates the key once it is past the period, at its
// next signing: two instances signing from many goroutines at once make
// one new key between them (the second takes the first's under the
// storage's lock), and cookies of the replaced key and the new one verify
// on both.
func TestSecretsRotateWhileRunning(t *testing.T) {
	st := &certmagic.FileStorage{Path: t.TempDir()}
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	a, b := loadAt(t, st, &clock), loadAt(t, st, &clock)
	first := a.current()
	far := time.Unix(0, clock.Load()).Add(3 * MinRotation)
	old, oldID := a.Mint("visitors", far)

	clock.Add(int64(MinRotation - time.Second))
	if k := settled(a).current(); !bytes.Equal(k.ID, first.ID) || len(storedKeys(t, st)) != 1 {
		t.Fatalf("a key just short of the period was replaced")
	}

	clock.Add(int64(2 * time.Second))
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, other := a, b
			if g%2 == 1 {
				s, other = b, a
			}
			for range 50 {
				now := time.Unix(0, clock.Load())
				v, id := s.Mint("visitors", far)
				if got, ok, _ := other.Identity("visitors", v, now); !ok || got != id {
					t.Errorf("a cookie signed during the rotation, on the other instance: %q %v", got, ok)
					return
				}
				tok := s.Issue("visitors", "10.0.0.1", 1, now, time.Minute)
				if _, r := other.Verify(tok, "10.0.0.1", Solve(tok, 1), now); r != "" {
					t.Errorf("a challenge issued during the rotation, on the other instance: %s", r)
					return
				}
			}
		}()
	}
	wg.Wait()
	settled(a)
	settled(b)

	keys := storedKeys(t, st)
	if len(keys) != 2 || !bytes.Equal(keys[1].ID, first.ID) {
		t.Fatalf("after two instances rotated at once: %d keys in storage, want the new one and the replaced one", len(keys))
	}
	for name, s := range map[string]*Secrets{"a": a, "b": b} {
		if k := s.current(); !bytes.Equal(k.ID, keys[0].ID) {
			t.Errorf("instance %s signs with key %x, want the new one %x", name, k.ID, keys[0].ID)
		}
	}
	now := time.Unix(0, clock.Load())
	fresh, freshID := a.Mint("visitors", far)
	for name, s := range map[string]*Secrets{"a": a, "b": b, "loaded after": loadAt(t, st, &clock)} {
		if got, ok, _ := s.Identity("visitors", old, now); !ok || got != oldID {
			t.Errorf("%s: a cookie of the replaced key: Identity = %q, %v; want %q", name, got, ok, oldID)
		}
		if got, ok, _ := s.Identity("visitors", fresh, now); !ok || got != freshID {
			t.Errorf("%s: a cookie of the new key: Identity = %q, %v; want %q", name, got, ok, freshID)
		}
	}
}

// lockFails is Caddy's file storage whose lock fails while fail is set.
type lockFails struct {
	*certmagic.FileStorage
	fail  atomic.Bool
	locks atomic.Int32
}

func (f *lockFails) Lock(ctx context.Context, name string) error {
	f.locks.Add(1)
	if f.fail.Load() {
		return errors.New("storage down")
	}
	return f.FileStorage.Lock(ctx, name)
}

// A rotation that fails keeps the current key signing, is tried again at
// most once per reloadEvery, and is logged once until one succeeds.
func TestSecretsRotationFailureKeepsSigning(t *testing.T) {
	st := &lockFails{FileStorage: &certmagic.FileStorage{Path: t.TempDir()}}
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	s := loadAt(t, st, &clock)
	var logged bytes.Buffer
	s.log = slog.New(slog.NewTextHandler(&logged, nil))
	first := s.current()
	st.fail.Store(true)
	clock.Add(int64(MinRotation + time.Second))

	for i, want := range []int32{2, 2, 3} {
		if i == 2 {
			clock.Add(int64(reloadEvery))
		}
		v, _ := s.Mint("visitors", time.Unix(0, clock.Load()).Add(time.Hour))
		if _, ok, _ := settled(s).Identity("visitors", v, time.Unix(0, clock.Load())); !ok || !bytes.Equal(s.current().ID, first.ID) {
			t.Fatalf("signing %d while the storage fails: the cookie verifies %v, want it signed by the current key", i, ok)
		}
		if got := st.locks.Load(); got != want {
			t.Errorf("signing %d while the storage fails: %d locks of the storage, want %d", i, got, want)
		}
	}
	if n := strings.Count(logged.String(), "level=WARN"); n != 1 || !strings.Contains(logged.String(), "storage down") {
		t.Errorf("two failed rotations logged %d warnings, want one naming the error: %s", n, logged.String())
	}

	st.fail.Store(false)
	clock.Add(int64(reloadEvery))
	s.current()
	if k := settled(s).current(); bytes.Equal(k.ID, first.ID) || len(storedKeys(t, st)) != 2 {
		t.Errorf("once the storage is back, the next try after reloadEvery rotates")
	}
}

// Zones whose cookies last differently share the one secret in the
// storage: it is replaced at the longest zone's period, so a shorter zone's
// rotations never drop the key a longer zone's cookie needs before the
// cookie expires.
func TestSecretsRotateAtTheLongestPeriodOfTheirZones(t *testing.T) {
	ctx := context.Background()
	st := &certmagic.FileStorage{Path: t.TempDir()}
	load := func(rotate time.Duration) *Secrets {
		t.Helper()
		s, err := LoadSecrets(ctx, st, rotate)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	const day = 24 * time.Hour
	long := load(60 * day) // valid 30d
	load(time.Hour)        // valid 30m: replaced every 7 days alone
	now := time.Now()
	cookie, id := long.Mint("long", now.Add(30*day))
	// Two weeks pass, the short zone's instance loading each week.
	for range 2 {
		raw, _ := st.Load(ctx, StorageKey)
		var stored []map[string]any
		_ = json.Unmarshal(raw, &stored)
		created, _ := time.Parse(time.RFC3339Nano, stored[0]["created"].(string))
		stored[0]["created"] = created.Add(-MinRotation - time.Minute)
		raw, _ = json.Marshal(stored)
		_ = st.Store(ctx, StorageKey, raw)
		load(time.Hour)
	}
	if got, ok, _ := load(60*day).Identity("long", cookie, now); !ok || got != id {
		t.Errorf("a 30-day cookie two weeks on, beside a zone of 30-minute cookies: Identity = %q, %v; want %q", got, ok, id)
	}
}
