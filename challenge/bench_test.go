package challenge

import (
	"strconv"
	"testing"
	"time"
)

// What a submission costs the server: one HMAC and one SHA-256.
func BenchmarkVerify(b *testing.B) {
	s := NewSecrets([]byte("0123456789abcdef0123456789abcdef"))
	now := time.Now()
	tok := s.Issue("visitors", "10.0.0.0/24", 4, now, time.Minute)
	nonce := Solve(tok, 4)
	b.ReportAllocs()
	for b.Loop() {
		if _, r := s.Verify(tok, "10.0.0.0/24", nonce, now); r != "" {
			b.Fatal(r)
		}
	}
}

// What a native solver pays per challenge, by difficulty (a fresh token
// each time: the mean is 16^d hashes).
func BenchmarkSolve(b *testing.B) {
	s := NewSecrets([]byte("0123456789abcdef0123456789abcdef"))
	for _, d := range []int{4, 5} {
		b.Run("difficulty="+strconv.Itoa(d), func(b *testing.B) {
			for b.Loop() {
				Solve(s.Issue("visitors", "k", d, time.Now(), time.Minute), d)
			}
		})
	}
}
