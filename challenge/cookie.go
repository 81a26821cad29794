package challenge

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"time"
)

// CookiePrefix starts a zone's cookie name: tally_<zone>.
const CookiePrefix = "tally_"

// IdentityPrefix starts the key a cookie's identity is decided under in
// its zone, so that it never shares a bucket with an address.
const IdentityPrefix = "cookie:"

// The cookie's layout: version, expiry (Unix seconds), random identity,
// the secret's id, then the MAC (over the zone's name too: a cookie of one
// zone is nothing in another).
const (
	cookieVersion = 2
	identityLen   = 16
	cookieBody    = 1 + 8 + identityLen + keyIDLen
	cookieLen     = (cookieBody + macLen + 2) / 3 * 4
)

// Mint returns a new cookie value for zone, valid until expires, and the
// identity it carries (IdentityPrefix and the random id).
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

// Identity returns the identity of zone's cookie value, or ok false when
// it is malformed, forged, signed by a secret these are not, or expired:
// a request with such a cookie is a request without one (bad reports that
// it was not merely expired).
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
