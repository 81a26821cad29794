// Command crosscheck type-checks the shipped module (the repository root)
// for every platform Caddy publishes builds for, so that a break on one of
// them (an int constant that overflows where int is 32 bits, a call that
// does not exist on Windows) fails make lint, not a user's xcaddy build.
//
// It runs what the compiler's front end runs, with each platform's GOOS,
// GOARCH, build tags and sizes, and reports every error in the module's own
// packages. Dependencies are read from source with their function bodies
// left out (their exported API is all the module's packages can see), which
// is what makes a platform take seconds instead of the minutes a full
// cross-build of Caddy takes on two cores. make test also builds and runs
// the unit tests under GOARCH=386, where the code generator runs too.
//
//	go run ./cmd/crosscheck [-dir ..] [platform ...]
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/tools/go/packages"
)

// platforms are those Caddy's releases are built for (its .goreleaser.yml),
// GOARM variants included: arm v5 and v6 and v7 differ in what the compiler
// may emit, not in what type-checks, but a platform-specific file would tell
// them apart.
var platforms = []string{
	"linux/amd64", "linux/arm64", "linux/arm/6", "linux/arm/7", "linux/386",
	"linux/ppc64le", "linux/s390x", "linux/riscv64", "linux/mips64le",
	"windows/amd64", "windows/arm64", "darwin/amd64", "darwin/arm64",
	"freebsd/amd64", "freebsd/arm64",
}

func main() {
	dir := flag.String("dir", "..", "the module to check")
	flag.Parse()
	root, err := filepath.Abs(*dir)
	if err != nil {
		fail(err)
	}
	list := platforms
	if flag.NArg() > 0 {
		list = flag.Args()
	}
	start := time.Now()
	var mu sync.Mutex
	var bad []string
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2) // two at a time: each is CPU-bound
	for _, p := range list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs, err := check(root, p)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				bad = append(bad, fmt.Sprintf("%s: %v", p, err))
				return
			}
			for _, e := range errs {
				bad = append(bad, p+": "+e)
			}
		}()
	}
	wg.Wait()
	if len(bad) > 0 {
		for _, b := range bad {
			fmt.Fprintln(os.Stderr, b)
		}
		fail(fmt.Errorf("%d errors: the module does not build on every platform Caddy ships", len(bad)))
	}
	fmt.Printf("crosscheck: %d platforms type-check (%s) in %v\n", len(list), strings.Join(list, " "), time.Since(start).Round(time.Second))
}

// check type-checks root's packages for platform "goos/goarch[/goarm]" and
// returns the errors in them.
func check(root, platform string) ([]string, error) {
	parts := strings.Split(platform, "/")
	if len(parts) < 2 {
		return nil, fmt.Errorf("platform %q is not goos/goarch", platform)
	}
	env := append(os.Environ(), "GOOS="+parts[0], "GOARCH="+parts[1], "CGO_ENABLED=0")
	if len(parts) == 3 {
		env = append(env, "GOARM="+parts[2])
	}
	own := root + string(filepath.Separator)
	cfg := &packages.Config{
		Mode: packages.LoadAllSyntax,
		Dir:  root,
		Env:  env,
		ParseFile: func(fset *token.FileSet, name string, src []byte) (*ast.File, error) {
			f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
			if f != nil && !strings.HasPrefix(name, own) {
				for _, d := range f.Decls {
					if fd, ok := d.(*ast.FuncDecl); ok {
						fd.Body = nil
					}
				}
			}
			return f, err
		},
	}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		return nil, err
	}
	// Dependencies without their bodies report unused imports, which are
	// not errors of theirs; only the module's own packages are judged.
	var errs []string
	for _, p := range pkgs {
		for _, e := range p.Errors {
			errs = append(errs, e.Error())
		}
	}
	if len(pkgs) == 0 {
		errs = append(errs, "no packages found in "+root)
	}
	return errs, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "crosscheck:", err)
	os.Exit(1)
}
