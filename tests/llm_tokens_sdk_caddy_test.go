package tests

// The official OpenAI and Anthropic Node clients (tests/sdk) through a
// real Caddy in front of the model LLM upstream: what each client parsed of
// every response's usage, streaming and not, is what charge tokens charged.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/tests/internal/llmupstream"
)

// sdkUsage is one line a tests/sdk script prints: the usage a client
// parsed of the response to the request sent with X-Test-Key: key.
type sdkUsage struct {
	Key           string
	Input, Output int64
}

// requireSDKs fails (never skips) when the Node clients cannot run.
func requireSDKs(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is not installed: this test drives the official OpenAI and Anthropic Node clients; install Node.js (20 or later), then run `make deps` (npm ci --prefix tests/sdk)")
	}
	for _, pkg := range []string{"openai", "@anthropic-ai/sdk"} {
		if _, err := os.Stat(filepath.Join("sdk", "node_modules", pkg, "package.json")); err != nil {
			t.Fatalf("the Node client %s is not installed in tests/sdk/node_modules: run `make deps` (npm ci --prefix tests/sdk)", pkg)
		}
	}
}

// runSDK runs a tests/sdk script and returns the usage it printed per case.
func runSDK(t *testing.T, script, baseURL, prefix string, u llmupstream.Usage) []sdkUsage {
	t.Helper()
	h := map[string]string{}
	for k, v := range u.Header() {
		h[k] = v[0]
	}
	headers, _ := json.Marshal(h)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join("sdk", script), baseURL, prefix, string(headers))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node sdk/%s: %v\n%s%s", script, err, out, stderr.String())
	}
	var got []sdkUsage
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var s sdkUsage
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("node sdk/%s printed %q: %v", script, sc.Text(), err)
		}
		got = append(got, s)
	}
	return got
}

func TestChargeTokensEqualsWhatTheOfficialSDKsParsed(t *testing.T) {
	t.Parallel()
	requireSDKs(t)
	up := llmupstream.Start(t)
	zones := strings.ReplaceAll(tokenZones, "{http.request.header.Authorization}", "{http.request.header.X-Test-Key}")
	c := startCaddy(t, loginSite(up.Addr, zones, ""))
	u := llmupstream.Usage{Input: 1000, Cached: 200, CacheCreation: 100, Output: 300, Reasoning: 50}
	got := append(runSDK(t, "openai.mjs", c.URL+"/v1", "openai", u), runSDK(t, "anthropic.mjs", c.URL, "anthropic", u)...)
	if len(got) != 6 {
		t.Fatalf("the clients reported %d responses, want 6 (chat and responses, JSON and stream; messages, JSON and stream): %+v", len(got), got)
	}
	for _, s := range got {
		if s.Input != u.Input || s.Output != u.Output {
			t.Errorf("%s: the client parsed %d in, %d out; the upstream sent %d, %d", s.Key, s.Input, s.Output, u.Input, u.Output)
		}
		waitCharged(t, c, "tok_input", s.Key, 1000000-s.Input)
		waitCharged(t, c, "tok_output", s.Key, 1000000-s.Output)
		waitCharged(t, c, "tok_total", s.Key, 1000000-s.Input-s.Output)
	}
}
