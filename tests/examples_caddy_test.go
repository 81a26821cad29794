package tests

// The Caddyfiles users copy: Caddyfile.example and the ```caddyfile blocks
// of the README and docs/*.md.

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// exampleFor returns ../Caddyfile.example with its ports moved to c's, bound
// to loopback and persisting nothing. Nothing else changes.
func exampleFor(t *testing.T, c *caddyInstance) string {
	t.Helper()
	b, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	edits := []struct{ re, with string }{
		{`(?m)^(\s*)admin localhost:2019\s*$`, "${1}admin 127.0.0.1:" + strconv.Itoa(c.AdminPort) +
			"\n${1}persist_config off\n${1}default_bind 127.0.0.1"},
		{`(?m)^(\s*)http_port 8080\s*$`, "${1}http_port " + strconv.Itoa(c.HTTPPort)},
		{`(?m)^:8080 \{`, ":" + strconv.Itoa(c.HTTPPort) + " {"},
	}
	for _, e := range edits {
		re := regexp.MustCompile(e.re)
		if !re.MatchString(text) {
			t.Fatalf("Caddyfile.example has no line matching %s: update this test with the example", e.re)
		}
		text = re.ReplaceAllString(text, e.with)
	}
	for i, line := range strings.Split(text, "\n") {
		if code, _, _ := strings.Cut(line, "#"); strings.Contains(code, "8080") || strings.Contains(code, "2019") {
			t.Fatalf("Caddyfile.example line %d still names a fixed port after rewriting: %s", i+1, line)
		}
	}
	return text
}

// checkExampleLimits sends what the example's comment suggests and checks
// what it promises: 10 per minute per API key on /api/, 5 per minute per
// client on /login, and the handle_errors body.
func checkExampleLimits(t *testing.T, c *caddyInstance) {
	t.Helper()
	var statuses []int
	var last response
	for i := 0; i < 11; i++ {
		last = c.Do(request{Path: "/api/", Header: map[string]string{"X-API-Key": "alice"}})
		statuses = append(statuses, last.Status)
	}
	if want := "[200 200 200 200 200 200 200 200 200 200 429]"; fmt.Sprint(statuses) != want {
		t.Fatalf("11 requests to /api/ with one X-API-Key: %v, want %s", statuses, want)
	}
	if want := "slow down: retry in 6s (api_key)"; last.Body != want {
		t.Errorf("denial body %q, want %q", last.Body, want)
	}
	if res := c.Do(request{Path: "/api/", Header: map[string]string{"X-API-Key": "bob"}}); res.Status != 200 {
		t.Errorf("another API key: status %d, want 200", res.Status)
	}
	if got := c.Send(6, request{Path: "/login"}); fmt.Sprint(got) != "[200 200 200 200 200 429]" {
		t.Errorf("6 requests to /login: %v, want 5×200 then 429", got)
	}
	if res := c.Do(request{Path: "/"}); res.Status != 200 || res.Body != "hello from tally" {
		t.Errorf("GET /: %d %q, want 200 \"hello from tally\"", res.Status, res.Body)
	}
}

func TestCaddyfileExampleRunsAsIs(t *testing.T) {
	t.Parallel()
	c := newCaddyInstance(t)
	c.Start(exampleFor(t, c), "caddyfile")
	checkExampleLimits(t, c)
	// What a user sees on every start of the shipped example: no warning
	// of tally's (a setting that does nothing, say).
	for _, line := range strings.Split(c.Output(), "\n") {
		if strings.Contains(line, `"level":"warn"`) && strings.Contains(line, "rate_limit") {
			t.Errorf("Caddyfile.example logs a warning on start: %s", line)
		}
	}
}

func TestCaddyfileExampleAdaptsToJSONThatRuns(t *testing.T) {
	t.Parallel()
	c := newCaddyInstance(t)
	json, stderr, err := adapt(t, exampleFor(t, c))
	if err != nil {
		t.Fatalf("caddy adapt Caddyfile.example: %v\n%s", err, stderr)
	}
	if !strings.Contains(json, `"handler":"rate_limit"`) {
		t.Fatalf("adapted JSON has no rate_limit handler:\n%s", json)
	}
	c.Start(json, "")
	checkExampleLimits(t, c)
}

// caddyfileBlock is a ```caddyfile fenced block of a Markdown file.
type caddyfileBlock struct {
	where string // file:line of its first line, the file relative to the repository
	text  string
}

// userDocs are the Markdown files users read: the README and docs/*.md,
// relative to the repository.
func userDocs(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md: the reference the README links to is missing")
	}
	files := []string{"README.md"}
	for _, d := range docs {
		files = append(files, strings.TrimPrefix(filepath.ToSlash(d), "../"))
	}
	return files
}

// caddyfileBlocks returns the ```caddyfile blocks of file (relative to the
// repository).
func caddyfileBlocks(t *testing.T, file string) []caddyfileBlock {
	t.Helper()
	f, err := os.Open(filepath.Join("..", file))
	if err != nil {
		t.Fatalf("the Caddyfile examples of %s cannot be checked: %v", file, err)
	}
	defer f.Close()
	var (
		blocks []caddyfileBlock
		cur    *caddyfileBlock
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```") && strings.EqualFold(strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), "caddyfile"):
			cur = &caddyfileBlock{where: fmt.Sprintf("%s:%d", file, n+1)}
		case cur != nil && strings.HasPrefix(trimmed, "```"):
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s: a ```caddyfile block starts here and is never closed", cur.where)
	}
	return blocks
}

// asWholeCaddyfile makes a snippet adaptable on its own: a bare
// rate_limit directive (or other directive) goes inside a site, a bare zone
// inside a rate_limit. Whole Caddyfiles are left alone.
func asWholeCaddyfile(snippet string) string {
	first := ""
	sc := bufio.NewScanner(strings.NewReader(snippet))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			first = strings.Fields(l)[0]
			break
		}
	}
	switch {
	case first == "zone", first == "distributed":
		return "http://127.0.0.1:8080 {\n\trate_limit {\n" + snippet + "\n\t}\n}\n"
	case strings.HasPrefix(first, "@"), slices.Contains([]string{"rate_limit", "handle_errors", "route", "handle", "respond", "reverse_proxy", "vars", "map"}, first):
		return "http://127.0.0.1:8080 {\n" + snippet + "\n}\n"
	}
	return snippet
}

// Every ```caddyfile block of the README and docs/*.md adapts, and is in
// caddy fmt form.
func TestReadmeAndDocsCaddyfilesAdapt(t *testing.T) {
	t.Parallel()
	var blocks []caddyfileBlock
	for _, file := range userDocs(t) {
		found := caddyfileBlocks(t, file)
		if file == "README.md" && len(found) == 0 {
			t.Fatal("README.md has no ```caddyfile blocks: it should show a Caddyfile for each common case")
		}
		blocks = append(blocks, found...)
	}
	for _, b := range blocks {
		t.Run(b.where, func(t *testing.T) {
			t.Parallel()
			json, stderr, err := adapt(t, asWholeCaddyfile(b.text))
			if err != nil {
				t.Fatalf("the ```caddyfile block at %s does not adapt: %v\n%s\nblock:\n%s", b.where, err, stderr, b.text)
			}
			if strings.Contains(b.text, "rate_limit") && !strings.Contains(json, `"rate_limit"`) {
				t.Errorf("the block at %s uses rate_limit but its JSON has no rate_limit handler:\n%s", b.where, json)
			}
			// In `caddy fmt` form, so that a copied block adapts without
			// "input is not formatted".
			if formatted := caddyFmt(t, b.text); formatted != b.text {
				t.Errorf("the block at %s is not in caddy fmt form; caddy fmt makes it:\n%s", b.where, formatted)
			}
		})
	}
}

// caddyFmt returns what `caddy fmt` makes of text.
func caddyFmt(t *testing.T, text string) string {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(caddyBinary(t), "fmt", file)
	cmd.Env = []string{"HOME=" + dir, "PATH=" + os.Getenv("PATH")}
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	_ = cmd.Run() // exits 1 when the input is not formatted; stdout has the formatted text either way
	if stdout.Len() == 0 {
		t.Fatalf("caddy fmt printed nothing for:\n%s", text)
	}
	return stdout.String()
}
