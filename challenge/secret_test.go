package challenge

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"sync"
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
