package challenge

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Storage is what Secrets needs of Caddy's storage: instances sharing it
// share the secret.
type Storage interface {
	Lock(ctx context.Context, name string) error
	Unlock(ctx context.Context, name string) error
	Store(ctx context.Context, key string, value []byte) error
	Load(ctx context.Context, key string) ([]byte, error)
}

// StorageKey is where the secrets are kept in Caddy's storage.
const StorageKey = "tally/challenge/secrets.json"

const keyIDLen = 4

// secret is one signing key as stored, named by the id tokens and cookies carry.
type secret struct {
	ID      []byte        `json:"id"`
	Key     []byte        `json:"key"`
	Created time.Time     `json:"created"`
	Rotate  time.Duration `json:"rotate,omitempty"` // the longest period of the zones that loaded it
}

// Secrets are the signing keys: the current one signs, it and the previous one
// verify. The first instance to find none in the storage creates one (under its
// lock); one past the rotation period is replaced and kept one more period, so a
// cookie valid for at most a period verifies until it expires. Signing with an
// old key starts a rotation in the background (one at a time, at most one per
// reloadEvery) that takes a key another instance made meanwhile; until one
// succeeds the current key signs, and the first failure is logged at WARN.
type Secrets struct {
	keys    atomic.Pointer[[]secret] // newest first, at most two
	storage Storage
	rotate  time.Duration
	log     *slog.Logger
	now     func() time.Time
	// reloaded: when an unknown key id last made the keys be read again.
	mu       sync.Mutex
	reloaded time.Time
	// rotating is held while a rotation runs; it guards rotated and warned.
	rotating sync.Mutex
	rotated  time.Time
	warned   bool
}

const reloadEvery = 10 * time.Second

// MinRotation is the shortest rotation period (never before a cookie it
// signed expires).
const MinRotation = 7 * 24 * time.Hour

// LoadSecrets reads the keys from storage (refresh). rotate is how old the
// current key may get (at least MinRotation and the longest cookie validity).
func LoadSecrets(ctx context.Context, st Storage, rotate time.Duration) (*Secrets, error) {
	s := &Secrets{storage: st, rotate: max(rotate, MinRotation), log: slog.Default(), now: time.Now}
	if l, ok := ctx.(interface{ Slogger() *slog.Logger }); ok {
		s.log = l.Slogger()
	}
	if err := s.refresh(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// refresh reads the keys under the storage's lock, adding one when none or
// the newest is older than its zones' longest period (this one's recorded).
func (s *Secrets) refresh(ctx context.Context) error {
	if err := s.storage.Lock(ctx, StorageKey); err != nil {
		return fmt.Errorf("locking the challenge secret in Caddy's storage: %v", err)
	}
	defer func() { _ = s.storage.Unlock(context.WithoutCancel(ctx), StorageKey) }()
	keys, err := s.read(ctx)
	if err != nil {
		return err
	}
	if now := s.now(); len(keys) == 0 || now.Sub(keys[0].Created) >= max(s.rotate, keys[0].Rotate) {
		fresh := secret{ID: make([]byte, keyIDLen), Key: make([]byte, 32), Created: now}
		_, _ = rand.Read(fresh.ID)
		_, _ = rand.Read(fresh.Key)
		keys = append([]secret{fresh}, keys...)[:min(len(keys)+1, 2)]
	}
	if keys[0].Rotate < s.rotate {
		keys[0].Rotate = s.rotate
		b, _ := json.Marshal(keys)
		if err := s.storage.Store(ctx, StorageKey, b); err != nil {
			return fmt.Errorf("storing the challenge secret in Caddy's storage: %v", err)
		}
	}
	s.keys.Store(&keys)
	return nil
}

// NewSecrets returns secrets of one key, kept nowhere (for tests).
func NewSecrets(key []byte) *Secrets {
	s := &Secrets{now: time.Now}
	keys := []secret{{ID: make([]byte, keyIDLen), Key: key, Created: time.Now()}}
	s.keys.Store(&keys)
	return s
}

func (s *Secrets) read(ctx context.Context) ([]secret, error) {
	b, err := s.storage.Load(ctx, StorageKey)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("loading the challenge secret from Caddy's storage: %v", err)
	}
	var keys []secret
	if err := json.Unmarshal(b, &keys); err != nil {
		return nil, fmt.Errorf("the challenge secret in Caddy's storage (%s) is corrupt: %v; delete it to make a new one (every challenge cookie is then refused once)", StorageKey, err)
	}
	for _, k := range keys {
		if len(k.ID) != keyIDLen || len(k.Key) < 32 {
			return nil, fmt.Errorf("the challenge secret in Caddy's storage (%s) is corrupt: a key is truncated; delete it to make a new one", StorageKey)
		}
	}
	return keys, nil
}

// current is the signing key, starting a rotation when it is past the period.
func (s *Secrets) current() secret {
	k, now := (*s.keys.Load())[0], s.now()
	if s.storage == nil || now.Sub(k.Created) < max(s.rotate, k.Rotate) || !s.rotating.TryLock() {
		return k
	}
	if now.Sub(s.rotated) >= reloadEvery {
		s.rotated = now
		go s.rotateNow() // unlocks rotating
	} else {
		s.rotating.Unlock()
	}
	return k
}

func (s *Secrets) rotateNow() {
	defer s.rotating.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), reloadEvery)
	defer cancel()
	err := s.refresh(ctx)
	if err != nil && !s.warned {
		s.log.Warn("rotating the challenge secret failed; the current one keeps signing until a retry (every 10s) succeeds", "storage_key", StorageKey, "error", err)
	}
	s.warned = err != nil
}

// byID is the key named id, read again from the storage when unknown (another
// instance may have rotated), at most once per reloadEvery; lookups wait for it.
func (s *Secrets) byID(id []byte) ([]byte, bool) {
	if key, ok := keyByID(*s.keys.Load(), id); ok || s.storage == nil {
		return key, ok
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	known := s.keys.Load()
	if key, ok := keyByID(*known, id); ok || s.now().Sub(s.reloaded) < reloadEvery {
		return key, ok
	}
	s.reloaded = s.now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	keys, err := s.read(ctx)
	if err != nil || len(keys) == 0 {
		return nil, false
	}
	s.keys.CompareAndSwap(known, &keys) // not over a rotation's newer keys
	return keyByID(keys, id)
}

func keyByID(keys []secret, id []byte) ([]byte, bool) {
	for _, k := range keys {
		if bytes.Equal(k.ID, id) {
			return k.Key, true
		}
	}
	return nil, false
}
