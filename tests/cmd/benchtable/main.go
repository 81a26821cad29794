// Command benchtable runs tally's benchmarks and prints the table quoted in
// docs/performance.md: the micro benchmarks (go test -bench) of the GCRA step, the
// zone table and the other limiters, then load scenarios against a real
// Caddy built from the working tree. Every figure it compares was measured in
// the same run, since the machines it runs on are noisy: ratios, not absolute
// times, are what to quote.
//
//	cd tests && go run ./cmd/benchtable
//
// Progress goes to stderr, the markdown table to stdout. -h lists the knobs;
// the defaults keep the whole run to about twelve minutes on two cores.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

func main() {
	var opts options
	flag.DurationVar(&opts.runFor, "duration", 3*time.Second, "length of one load run")
	flag.IntVar(&opts.rounds, "rounds", 3, "alternating baseline/candidate rounds per scenario; the median of each is compared")
	flag.IntVar(&opts.conns, "conns", 48, "keep-alive connections of the load generator")
	flag.Int64Var(&opts.maxRequests, "max-requests", 2_000_000, "bound on the requests of one load run")
	flag.BoolVar(&opts.skipMicro, "skip-micro", false, "skip the go test benchmarks")
	flag.BoolVar(&opts.skipLoad, "skip-load", false, "skip the Caddy load scenarios")
	flag.StringVar(&opts.microOnly, "micro", "", "run only the go test benchmarks whose -bench pattern contains this text (e.g. Global)")
	flag.StringVar(&opts.only, "scenarios", "", "comma-separated scenario names to run (default: all)")
	flag.StringVar(&opts.baselineRef, "baseline-ref", defaultBaselineRef, "git revision of this repository whose tally-caddy the scenarios that compare two binaries (override-none-vs-baseline) build as their baseline")
	flag.StringVar(&opts.profileDir, "profile", "", "save a CPU profile of Caddy during each scenario's last candidate run to this directory")
	flag.Parse()

	start := time.Now()
	testsDir, err := modDir()
	if err != nil {
		fatalf("benchtable runs from the tests module (cd tests && go run ./cmd/benchtable): %v", err)
	}
	opts.testsDir = testsDir
	opts.rootDir = filepath.Dir(testsDir)

	t := table{partial: opts.microOnly != ""}
	if !opts.skipMicro {
		t.micro = runMicro(opts)
	}
	if !opts.skipLoad {
		t.load = runScenarios(opts)
	}

	fmt.Printf("Command: `cd tests && go run ./cmd/benchtable%s` (what `make bench` runs)\n\n", argsSuffix())
	fmt.Printf("Date: %s · %s · %d CPUs (%s) · load average at start %s · took %s\n\n",
		start.UTC().Format("2006-01-02 15:04 MST"), runtime.Version(), runtime.NumCPU(), cpuModel(), loadAverage(),
		time.Since(start).Round(time.Second))
	t.print(os.Stdout)
}

// options are benchtable's flags and where it runs.
type options struct {
	runFor      time.Duration
	rounds      int
	conns       int
	maxRequests int64
	skipMicro   bool
	skipLoad    bool
	microOnly   string
	only        string
	profileDir  string
	baselineRef string
	testsDir    string // the tests module
	rootDir     string // the tally module
}

func (o options) wants(scenario string) bool {
	if o.only == "" {
		return true
	}
	for _, name := range strings.Split(o.only, ",") {
		if strings.TrimSpace(name) == scenario {
			return true
		}
	}
	return false
}

// modDir is the directory of the current module's go.mod, which must be the
// tests module.
func modDir() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	gomod := strings.TrimSpace(string(out))
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	if !strings.Contains(string(data), "module github.com/caddy-tally/ratelimit/tests") {
		return "", fmt.Errorf("%s is not the tests module", gomod)
	}
	return filepath.Dir(gomod), nil
}

func argsSuffix() string {
	if len(os.Args) < 2 {
		return ""
	}
	return " " + strings.Join(os.Args[1:], " ")
}

func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, line := range strings.Split(string(data), "\n") {
		if name, ok := strings.CutPrefix(line, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
		}
	}
	return runtime.GOARCH
}

func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func progressf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchtable: "+format+"\n", args...)
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchtable: "+format+"\n", args...)
	os.Exit(1)
}
