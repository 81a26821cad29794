package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// A key read from a request header without the replacer is what the
// replacer gives: values joined by ",", "" when absent, whatever the case of
// the name in the template.
func TestHeaderKeyReadsLikeTheReplacer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tpl    string
		values []string
	}{
		{"one value", "{http.request.header.X-Api-Key}", []string{"alice"}},
		{"several values", "{http.request.header.X-Api-Key}", []string{"alice", "bob"}},
		{"absent", "{http.request.header.X-Api-Key}", nil},
		{"lower-case name", "{http.request.header.x-api-key}", []string{"carol"}},
		{"empty value", "{http.request.header.X-Api-Key}", []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			for _, v := range tc.values {
				r.Header.Add("X-Api-Key", v)
			}
			repl := caddyhttp.NewTestReplacer(r)
			keyVar := singlePlaceholder(tc.tpl)
			z := &zoneHandler{key: tc.tpl, keyVar: keyVar}
			want := (&zoneHandler{key: tc.tpl, keyVar: keyVar}).expandKey(r, repl) // replacer path
			z.keyHeader = headerPlaceholder(keyVar)
			if z.keyHeader == "" {
				t.Fatalf("%s is not read as a header", tc.tpl)
			}
			if got := z.expandKey(r, repl); got != want {
				t.Fatalf("key %q, the replacer gives %q", got, want)
			}
		})
	}
}
