package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// benchRun is one `go test -bench` invocation: where, which benchmarks, and
// with which -benchtime.
type benchRun struct {
	dir       string // relative to the tally module
	packages  []string
	pattern   string
	benchtime string
}

// microRuns are the go test invocations benchtable makes. The strict-mode
// ones (tests/store_bench_test.go) start their own redis-server and are
// bounded by count.
var microRuns = []benchRun{
	{dir: ".", packages: []string{"./algorithms", "./zones"},
		pattern: "^(BenchmarkDecide|BenchmarkTableDecideExistingKey|BenchmarkZoneDecideParallel|BenchmarkZoneWithBanDecideParallel|BenchmarkTableBytesPerKey|BenchmarkTableBytesPerKeyAtMaxKeys)$", benchtime: "1s"},
	{dir: ".", packages: []string{"."}, pattern: "^(BenchmarkServeHTTPAllowedExistingKey|BenchmarkServeHTTPDelay|BenchmarkServeHTTPAdaptiveVsConcurrency)$", benchtime: "1s"},
	{dir: ".", packages: []string{"."}, pattern: "^BenchmarkDelayWaitingMemory$", benchtime: "1x"},
	{dir: ".", packages: []string{"./zones"}, pattern: "^(BenchmarkSnapshot1M|BenchmarkDecideDuringSnapshot)$", benchtime: "3x"},
	{dir: "tests", packages: []string{"."}, pattern: "^BenchmarkLocal", benchtime: "1s"},
	{dir: "tests", packages: []string{"."}, pattern: "^(BenchmarkStrict|BenchmarkRedisRate)", benchtime: "20000x"},
	// Multi-region (issue 29), ~40s together: 3 alternating rounds of
	// 150,000 decisions per scope, 20 alternating rounds of 100 script
	// calls per scope, 9 syncs of 10k hot keys (3 per
	// region), 4 demand moves.
	{dir: "tests", packages: []string{"."}, pattern: "^BenchmarkGlobalDecisionRedisCPU$", benchtime: "3x"},
	{dir: "tests", packages: []string{"."}, pattern: "^BenchmarkGlobalScriptPerKey$", benchtime: "20x"},
	{dir: "tests", packages: []string{"."}, pattern: "^BenchmarkGlobalSyncHotKeys$", benchtime: "9x"},
	{dir: "tests", packages: []string{"."}, pattern: "^BenchmarkGlobalSharesFollowDemand$", benchtime: "4x"},
	// The challenge (issue 53): chromium solving 3 challenges at
	// difficulty 4 and 3 at 5 (most of a minute each at 5 on two cores),
	// and one run of the crawler model (~15 s).
	{dir: "tests", packages: []string{"."}, pattern: "^BenchmarkChallengeBrowserSolve$", benchtime: "3x"},
	{dir: "tests", packages: []string{"."}, pattern: "^BenchmarkChallengeCrawler$", benchtime: "1x"},
}

// benchResult is one benchmark's line of output: its metrics by unit
// (ns/op, allocs/op, bytes/key, decisions/s, ...).
type benchResult struct {
	name    string // without the -GOMAXPROCS suffix
	metrics map[string]float64
	units   []string // in the order printed
}

// microResults are every benchmark line parsed, in order, and the
// invocations that failed.
type microResults struct {
	byName   map[string]benchResult
	order    []string
	failures []string
}

func (m microResults) get(name string) (benchResult, bool) {
	r, ok := m.byName[name]
	return r, ok
}

func runMicro(o options) microResults {
	res := microResults{byName: map[string]benchResult{}}
	for _, run := range microRuns {
		if !strings.Contains(run.pattern, o.microOnly) {
			continue
		}
		args := append([]string{"test", "-run", "^$", "-bench", run.pattern, "-benchmem", "-benchtime", run.benchtime}, run.packages...)
		cmd := exec.Command("go", args...)
		cmd.Dir = o.rootDir + "/" + run.dir
		progressf("(cd %s && go %s)", run.dir, strings.Join(args, " "))
		out, err := cmd.CombinedOutput()
		for _, r := range parseBench(out) {
			if _, seen := res.byName[r.name]; !seen {
				res.order = append(res.order, r.name)
			}
			res.byName[r.name] = r
		}
		if err != nil {
			res.failures = append(res.failures, fmt.Sprintf("`go %s` in %s: %v: %s", strings.Join(args, " "), run.dir, err, lastLines(out, 3)))
			progressf("failed: %v\n%s", err, lastLines(out, 20))
		}
	}
	return res
}

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(-\d+)?\s+\d+\s+(.*)$`)

// parseBench reads the benchmark lines of go test output.
func parseBench(out []byte) []benchResult {
	var results []benchResult
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		r := benchResult{name: m[1], metrics: map[string]float64{}}
		f := strings.Fields(m[3])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			r.metrics[f[i+1]] = v
			r.units = append(r.units, f[i+1])
		}
		results = append(results, r)
	}
	return results
}

func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " / ")
}
