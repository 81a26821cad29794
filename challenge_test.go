package ratelimit

import (
	"testing"
)

func TestChallengeReturnsOnlyToThisSite(t *testing.T) {
	for ret, want := range map[string]string{
		"/page?x=1":             "/page?x=1",
		"//evil.example/":       "/",
		"https://evil.example/": "/",
		"/\\evil.example":       "/",
		"javascript:alert(1)":   "/",
		"":                      "/",
		"/a\r\nSet-Cookie: x=1": "/",
	} {
		if got := sameSiteReturn(ret); got != want {
			t.Errorf("sameSiteReturn(%q) = %q, want %q", ret, got, want)
		}
	}
}
