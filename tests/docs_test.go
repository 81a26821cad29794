package tests

// The README and docs/*.md hold together: every relative link reaches a
// file, and a heading where it names one; the ACL line they give is the one
// the tests run tally as.

import (
	"bufio"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown file (lower case, punctuation dropped, spaces to hyphens, -1, -2
// for repeats), outside fenced code.
func headingAnchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	fenced := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var slug strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				slug.WriteRune(r)
			case r == ' ':
				slug.WriteRune('-')
			}
		}
		a := slug.String()
		for i := 1; anchors[a]; i++ {
			a = slug.String() + "-" + strconv.Itoa(i)
		}
		anchors[a] = true
	}
	return anchors
}

var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

func TestDocsLinksResolve(t *testing.T) {
	t.Parallel()
	anchors := map[string]map[string]bool{} // by file, relative to the repository
	anchorsOf := func(file string) map[string]bool {
		if anchors[file] == nil {
			anchors[file] = headingAnchors(t, filepath.Join("..", filepath.FromSlash(file)))
		}
		return anchors[file]
	}
	links := 0
	for _, file := range userDocs(t) {
		f, err := os.Open(filepath.Join("..", filepath.FromSlash(file)))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		fenced := false
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced = !fenced
			}
			if fenced {
				continue
			}
			for _, m := range markdownLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				p, anchor, _ := strings.Cut(target, "#")
				dest := file
				if p != "" {
					dest = path.Clean(path.Join(path.Dir(file), p))
					if _, err := os.Stat(filepath.Join("..", filepath.FromSlash(dest))); err != nil {
						t.Errorf("%s:%d: the link to %s reaches nothing: %v", file, n, target, err)
						continue
					}
				}
				if anchor != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[anchor] {
					t.Errorf("%s:%d: the link to %s names no heading of %s", file, n, target, dest)
				}
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if links < 10 {
		t.Fatalf("found %d relative links in the README and docs/*.md: the scan is broken", links)
	}
}

// The ACL line users copy is the one TestLeastPrivilegeACLUserCanDoEverythingTallyDoes
// runs tally as (with the docs' password).
func TestDocsACLLineIsTheTestedOne(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/distributed.md")
	if err != nil {
		t.Fatal(err)
	}
	want := "ACL SETUSER tally " + strings.Replace(leastPrivilegeACL, ">tally-secret", ">secret", 1)
	if !strings.Contains(string(b), want+"\n") {
		t.Errorf("docs/distributed.md does not give the ACL line the tests use:\n%s", want)
	}
}
