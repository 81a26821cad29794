// Package challenge is the proof-of-work challenge a zone can answer with at
// its limit: a signed token bound to the client's zone key, expiry and
// difficulty; the nonce's check; the cookie a solution earns, whose identity
// has a budget of its own; their secret in Caddy's storage; the difficulty
// that follows a network's pressure; the page. The root wires it in
// (challenge.go). Verifying is stateless: one HMAC, one SHA-256, and the
// caller's replay guard (the zone's store: one step per solved challenge).
package challenge

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"hash/fnv"
	"strconv"
	"strings"
	"time"
)

// VerifyPath is where the page POSTs a solution (form: challenge, nonce,
// elapsed_ms, return).
const VerifyPath = "/.well-known/tally/challenge"

// Reason is why a submission or a cookie was refused; "" is none.
type Reason string

// The reasons, as the metrics label them.
const (
	Malformed    Reason = "malformed"     // not a token, a nonce or a form
	Forged       Reason = "forged"        // the signature does not hold
	WrongKey     Reason = "wrong_key"     // issued to another zone key (another client)
	Expired      Reason = "expired"       // past its expiry
	BadNonce     Reason = "bad_nonce"     // the hash does not start with the zeros
	Replayed     Reason = "replayed"      // solved before (the caller's guard says)
	ForgedCookie Reason = "forged_cookie" // a cookie that does not verify
)

// Reasons are every reason a failure can have, for binding metrics.
var Reasons = []Reason{Malformed, Forged, WrongKey, Expired, BadNonce, Replayed, ForgedCookie}

// The token's layout: version, expiry (Unix seconds), difficulty, random id, the
// zone key's fingerprint (wrong_key, not forged), the secret's id, zone, MAC.
const (
	tokenVersion = 1
	idLen        = 12
	headLen      = 1 + 8 + 1 + idLen + 8 + keyIDLen
	macLen       = 16
	// MaxTokenLen bounds what is decoded: a zone name of MaxZoneLen at most.
	MaxZoneLen  = 128
	MaxTokenLen = (headLen + MaxZoneLen + macLen + 2) / 3 * 4
)

// Challenge is a verified token's content.
type Challenge struct {
	Zone       string
	ID         string // unique per token: the replay guard's key
	Difficulty int
	Expires    time.Time
}

// Issue returns a token for zone key key of zone, of difficulty d, valid
// for ttl from now.
func (s *Secrets) Issue(zone, key string, d int, now time.Time, ttl time.Duration) string {
	k := s.current()
	buf := make([]byte, headLen, headLen+len(zone)+macLen)
	buf[0] = tokenVersion
	binary.BigEndian.PutUint64(buf[1:9], uint64(now.Add(ttl).Unix()))
	buf[9] = byte(d)
	_, _ = rand.Read(buf[10 : 10+idLen])
	binary.BigEndian.PutUint64(buf[10+idLen:18+idLen], fingerprint(key))
	copy(buf[18+idLen:], k.ID)
	buf = append(buf, zone...)
	buf = append(buf, sign(k.Key, "challenge", buf, []byte(key))...)
	return base64.RawURLEncoding.EncodeToString(buf)
}

// Zone returns the zone a token names, unverified (whose key it is checked
// against).
func Zone(token string) (string, bool) {
	b, ok := decodeToken(token)
	if !ok {
		return "", false
	}
	return string(b[headLen : len(b)-macLen]), true
}

// Verify checks a submission: token, issued for key, and nonce (1 to 20 digits)
// that Solves it. The caller then asks its replay guard about the ID.
func (s *Secrets) Verify(token, key, nonce string, now time.Time) (Challenge, Reason) {
	b, ok := decodeToken(token)
	if !ok || nonce == "" || len(nonce) > 20 || strings.Trim(nonce, "0123456789") != "" {
		return Challenge{}, Malformed
	}
	body, mac := b[:len(b)-macLen], b[len(b)-macLen:]
	if known, ok := s.check(b[18+idLen:headLen], mac, "challenge", body, []byte(key)); !ok {
		if known && binary.BigEndian.Uint64(b[10+idLen:18+idLen]) != fingerprint(key) {
			return Challenge{}, WrongKey
		}
		return Challenge{}, Forged
	}
	c := Challenge{
		Zone:       string(b[headLen : len(b)-macLen]),
		ID:         base64.RawURLEncoding.EncodeToString(b[10 : 10+idLen]),
		Difficulty: int(b[9]),
		Expires:    time.Unix(int64(binary.BigEndian.Uint64(b[1:9])), 0),
	}
	if !now.Before(c.Expires) {
		return c, Expired
	}
	if !Solves(token, nonce, c.Difficulty) {
		return c, BadNonce
	}
	return c, ""
}

// Solves reports whether hex(SHA-256(token + nonce)) starts with d zeros.
func Solves(token, nonce string, d int) bool {
	sum := sha256.Sum256([]byte(token + nonce))
	if d > 2*len(sum) {
		return false
	}
	for _, b := range sum[:d/2] {
		if b != 0 {
			return false
		}
	}
	return d%2 == 0 || sum[d/2]>>4 == 0
}

// Solve finds the smallest nonce that solves token at difficulty d (a
// native solver).
func Solve(token string, d int) string {
	for n := uint64(0); ; n++ {
		s := strconv.FormatUint(n, 10)
		if Solves(token, s, d) {
			return s
		}
	}
}

func decodeToken(token string) ([]byte, bool) {
	if len(token) > MaxTokenLen {
		return nil, false
	}
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(b) <= headLen+macLen || b[0] != tokenVersion {
		return nil, false
	}
	return b, true
}

// sign is the MAC of a and b under a label, so a token's MAC is never a
// cookie's: a token signs its body and zone key, a cookie its zone and body.
func sign(secret []byte, label string, a, b []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("tally " + label + "\x00"))
	m.Write(a)
	m.Write([]byte{0})
	m.Write(b)
	return m.Sum(nil)[:macLen]
}

// check reports whether the secret named kid is known, and mac signs a and
// b under label.
func (s *Secrets) check(kid, mac []byte, label string, a, b []byte) (known, ok bool) {
	secret, known := s.byID(kid)
	return known, known && hmac.Equal(mac, sign(secret, label, a, b))
}

// fingerprint tells which key a token was issued to (to name wrong_key, not
// to bind it).
func fingerprint(key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64()
}

// CookiePrefix starts a zone's cookie name: tally_<zone>.
const CookiePrefix = "tally_"

// IdentityPrefix starts a cookie identity's key: it never shares an
// address's bucket.
const IdentityPrefix = "cookie:"

// The cookie's layout: version, expiry (Unix seconds), random identity, the
// secret's id, the MAC (over the zone's name: nothing in another zone).
const (
	cookieVersion = 2
	identityLen   = 16
	cookieBody    = 1 + 8 + identityLen + keyIDLen
	cookieLen     = (cookieBody + macLen + 2) / 3 * 4
)

// Mint returns a new cookie value for zone, valid until expires, and its identity.
func (s *Secrets) Mint(zone string, expires time.Time) (value, identity string) {
	k := s.current()
	b := make([]byte, cookieBody, cookieBody+macLen)
	b[0] = cookieVersion
	binary.BigEndian.PutUint64(b[1:9], uint64(expires.Unix()))
	_, _ = rand.Read(b[9 : 9+identityLen])
	copy(b[9+identityLen:], k.ID)
	b = append(b, sign(k.Key, "cookie", []byte(zone), b)...)
	return base64.RawURLEncoding.EncodeToString(b), IdentityPrefix + base64.RawURLEncoding.EncodeToString(b[9:9+identityLen])
}

// Identity returns zone's cookie's identity, or ok false (a request without a
// cookie) when it is expired or (bad) malformed, forged or of an unknown secret.
func (s *Secrets) Identity(zone, value string, now time.Time) (identity string, ok, bad bool) {
	if len(value) != cookieLen {
		return "", false, true
	}
	var b [cookieBody + macLen]byte
	if n, err := base64.RawURLEncoding.Decode(b[:], []byte(value)); err != nil || n != len(b) || b[0] != cookieVersion {
		return "", false, true
	}
	if _, ok := s.check(b[9+identityLen:cookieBody], b[cookieBody:], "cookie", []byte(zone), b[:cookieBody]); !ok {
		return "", false, true
	}
	if now.Unix() >= int64(binary.BigEndian.Uint64(b[1:9])) {
		return "", false, false
	}
	return IdentityPrefix + base64.RawURLEncoding.EncodeToString(b[9:9+identityLen]), true, false
}
