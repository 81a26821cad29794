package challenge

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestVerifyNamesEachReason(t *testing.T) {
	s := NewSecrets([]byte("0123456789abcdef0123456789abcdef"))
	now := time.Now()
	tok := s.Issue("visitors", "10.0.0.0/24", 2, now, time.Minute)
	if z, ok := Zone(tok); !ok || z != "visitors" {
		t.Fatalf("Zone(token) = %q, %v; want visitors", z, ok)
	}
	nonce := Solve(tok, 2)
	wrong := "0"
	for Solves(tok, wrong, 2) {
		wrong += "0"
	}
	flipped := []byte(tok)
	flipped[20] = map[bool]byte{true: 'B', false: 'A'}[flipped[20] == 'A'] // the random id
	other := NewSecrets([]byte("another site's secret, 32 bytes!"))
	for _, c := range []struct {
		name, token, key, nonce string
		at                      time.Time
		want                    Reason
	}{
		{"solved", tok, "10.0.0.0/24", nonce, now, ""},
		{"bad nonce", tok, "10.0.0.0/24", wrong, now, BadNonce},
		{"expired", tok, "10.0.0.0/24", nonce, now.Add(2 * time.Minute), Expired},
		{"another key", tok, "10.0.1.0/24", nonce, now, WrongKey},
		{"tampered", string(flipped), "10.0.0.0/24", nonce, now, Forged},
		{"truncated", tok[:len(tok)-3], "10.0.0.0/24", nonce, now, Forged},
		{"not base64", tok + "!", "10.0.0.0/24", nonce, now, Malformed},
		{"nonce not decimal", tok, "10.0.0.0/24", "1e3", now, Malformed},
		{"too long", strings.Repeat("A", MaxTokenLen+1), "k", "1", now, Malformed},
	} {
		if _, got := s.Verify(c.token, c.key, c.nonce, c.at); got != c.want {
			t.Errorf("%s: Verify = %q, want %q", c.name, got, c.want)
		}
	}
	if _, got := other.Verify(tok, "10.0.0.0/24", nonce, now); got != Forged {
		t.Errorf("another secret: Verify = %q, want forged", got)
	}
}

func TestCookieIdentity(t *testing.T) {
	s := NewSecrets([]byte("0123456789abcdef0123456789abcdef"))
	now := time.Now()
	v, id := s.Mint("visitors", now.Add(time.Hour))
	if got, ok, _ := s.Identity("visitors", v, now); !ok || got != id || !strings.HasPrefix(id, IdentityPrefix) {
		t.Fatalf("Identity = %q, %v; want %q", got, ok, id)
	}
	if _, ok, bad := s.Identity("visitors", v, now.Add(time.Hour)); ok || bad {
		t.Errorf("an expired cookie: ok %v bad %v; want neither", ok, bad)
	}
	if _, ok, bad := s.Identity("other", v, now); ok || !bad {
		t.Errorf("another zone's cookie: ok %v bad %v; want bad", ok, bad)
	}
	if _, ok, bad := s.Identity("visitors", v[:len(v)-1], now); ok || !bad {
		t.Errorf("a truncated cookie: ok %v bad %v; want bad", ok, bad)
	}
	if _, ok, bad := NewSecrets([]byte("another site's secret, 32 bytes!")).Identity("visitors", v, now); ok || !bad {
		t.Errorf("another secret's cookie: ok %v bad %v; want bad", ok, bad)
	}
}

func TestPressureRisesAndCalms(t *testing.T) {
	p := &Pressure{Min: 4, Max: 6}
	now := time.Now()
	var d int
	for i := 0; i < 300; i++ {
		d = p.Next("10.0.0.0/24", now)
	}
	if d != 6 {
		t.Errorf("after 300 challenges at once: difficulty %d, want 6", d)
	}
	if d := p.Next("10.0.1.0/24", now); d != 4 {
		t.Errorf("another network: difficulty %d, want 4", d)
	}
	if d := p.Next("10.0.0.0/24", now.Add(20*HalfLife)); d != 4 {
		t.Errorf("after a calm: difficulty %d, want 4", d)
	}
}

func TestScriptHashIsTheScripts(t *testing.T) {
	page := string(Page("tok", 4, time.Minute))
	i, j := strings.Index(page, "<script>"), strings.Index(page, "</script>")
	sum := sha256.Sum256([]byte(page[i+len("<script>") : j]))
	if want := "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"; ScriptHash != want {
		t.Fatalf("ScriptHash %s, the page's script hashes to %s", ScriptHash, want)
	}
	t.Logf("CSP: script-src %s", ScriptHash)
}

func TestIdentitiesInUseAndBounded(t *testing.T) {
	var s Identities
	now := time.Now()
	s.Seen("cookie:a", now.Add(-2*time.Hour))
	s.Seen("cookie:b", now)
	s.Seen("cookie:b", now)
	if n := s.InUse(now, time.Hour); n != 1 {
		t.Fatalf("in use within the hour: %d, want 1 (b; a is older)", n)
	}
	for i := range MaxIdentities + 10 {
		s.Seen("cookie:"+strconv.Itoa(i), now)
	}
	if n := s.InUse(now, time.Hour); n != MaxIdentities {
		t.Fatalf("after more than the bound: %d kept, want %d", n, MaxIdentities)
	}
}
