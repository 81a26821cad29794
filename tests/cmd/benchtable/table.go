package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// table is everything measured, printed as one markdown table.
type table struct {
	micro microResults
	load  []scenarioResult
	// partial: only some micro benchmarks ran (-micro); the rows of the
	// others are left out rather than shown as not run
	partial bool
}

// row is one line of the table.
type row struct {
	metric, tally, comparison, target, met string
}

func (t table) print(w io.Writer) {
	var rows []row
	if t.micro.byName != nil {
		for _, r := range t.microRows() {
			if !t.partial || !strings.HasPrefix(r.tally, "not run") {
				rows = append(rows, r)
			}
		}
	}
	for _, r := range t.load {
		rows = append(rows, loadRow(r))
	}
	fmt.Fprintln(w, "| metric | tally | comparison | target | met |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- |")
	for _, r := range rows {
		if r.comparison == "" {
			r.comparison = "—"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", r.metric, r.tally, r.comparison, r.target, r.met)
	}
	for _, f := range t.micro.failures {
		fmt.Fprintf(w, "\nFailed: %s\n", f)
	}
}

// microRows turns the go test benchmarks into rows. A benchmark missing from
// the output shows as "not run", which with a failure listed below the table
// says why.
func (t table) microRows() []row {
	m := t.micro
	var rows []row

	decide, ok := m.get("BenchmarkDecide")
	rows = append(rows, row{
		metric: "GCRA step (`algorithms` BenchmarkDecide)",
		tally:  figure(decide, ok, "ns/op", "allocs/op"),
		target: "≤ 30 ns/op, 0 allocs/op",
		met:    yesNo(ok && decide.metrics["ns/op"] <= 30 && decide.metrics["allocs/op"] == 0),
	})
	for _, b := range []struct{ name, metric string }{
		{"BenchmarkTableDecideExistingKey", "Table decide, existing key of 100k, one goroutine (`zones`)"},
		{"BenchmarkZoneDecideParallel", "Zone decide, existing key of 100k, all Ps (`zones`)"},
	} {
		r, ok := m.get(b.name)
		rows = append(rows, row{
			metric: b.metric,
			tally:  figure(r, ok, "ns/op", "allocs/op"),
			target: "0 allocs/op",
			met:    yesNo(ok && r.metrics["allocs/op"] == 0),
		})
	}
	zd, zok := m.get("BenchmarkZoneDecideParallel")
	zb, bok := m.get("BenchmarkZoneWithBanDecideParallel")
	rows = append(rows, row{
		metric:     "Zone decide with `ban 1h`, no key banned, existing key of 100k, all Ps (`zones`)",
		tally:      figure(zb, bok, "ns/op", "allocs/op"),
		comparison: "the same zone without ban, same run: " + figure(zd, zok, "ns/op", "allocs/op"),
		target:     "0 allocs/op",
		met:        yesNo(bok && zb.metrics["allocs/op"] == 0),
	})
	tb, ok := m.get("BenchmarkTableBytesPerKey")
	rows = append(rows, row{
		metric:     "Memory per tracked key, 100k keys of 16 B (`zones` Table)",
		tally:      figure(tb, ok, "table-bytes/key", "bytes/key") + " (table + key)",
		comparison: "mholt/caddy-ratelimit: 24 B × events per key (2,400 B at events 100)",
		target:     "≤ 96 B + key bytes",
		met:        yesNo(ok && tb.metrics["table-bytes/key"] <= 96),
	})
	tm1, ok := m.get("BenchmarkTableBytesPerKeyAtMaxKeys")
	rows = append(rows, row{
		metric: "Memory per tracked key, 1M keys of 16 B, the default max_keys (`zones` Table)",
		tally:  figure(tm1, ok, "table-bytes/key", "bytes/key") + " (table + key)",
		target: "≤ 64 B/key (heap; RSS ≤ 128)",
		met:    yesNo(ok && tm1.metrics["bytes/key"] <= 64),
	})
	for _, mode := range []string{"off", "both", "ietf", "legacy"} {
		r, ok := m.get("BenchmarkServeHTTPAllowedExistingKey/headers=" + mode)
		want := 1.0 // the header values' slice
		if mode == "off" {
			want = 0
		}
		rows = append(rows, row{
			metric: "Handler ServeHTTP, allowed request on an existing key, `headers " + mode + "` (root package)",
			tally:  figure(r, ok, "ns/op", "allocs/op", "B/op"),
			target: fmt.Sprintf("%.0f allocs/op", want),
			met:    yesNo(ok && r.metrics["allocs/op"] <= want),
		})
	}

	da, dok := m.get("BenchmarkServeHTTPDelay/allowed")
	plain, pok := m.get("BenchmarkServeHTTPDelay/allowed-without-delay")
	rows = append(rows, row{
		metric:     "Handler ServeHTTP, allowed at once by a zone with `delay 3s`, `headers both` (root package)",
		tally:      figure(da, dok, "ns/op", "allocs/op", "cpu-ns/op"),
		comparison: "the same zone without delay, same run: " + figure(plain, pok, "ns/op", "allocs/op", "cpu-ns/op"),
		target:     "no allocation more than without delay",
		met:        yesNo(dok && pok && da.metrics["allocs/op"] <= plain.metrics["allocs/op"]),
	})
	dd, ddok := m.get("BenchmarkServeHTTPDelay/delayed")
	ao, aok := m.get("BenchmarkServeHTTPDelay/at-once")
	rows = append(rows, row{
		metric:     "Handler ServeHTTP, a request that waits for its turn (64 goroutines, one key of 50,000/s, burst 1; process CPU per request)",
		tally:      figure(dd, ddok, "cpu-ns/op", "delayed-share", "allocs/op"),
		comparison: "the same harness allowed at once, same run: " + figure(ao, aok, "cpu-ns/op"),
		target:     "—",
		met:        "—",
	})
	ad, adok := m.get("BenchmarkServeHTTPAdaptiveVsConcurrency/adaptive")
	cd, cdok := m.get("BenchmarkServeHTTPAdaptiveVsConcurrency/concurrency")
	rows = append(rows, row{
		metric:     "Handler ServeHTTP, allowed in an adaptive zone with two priority classes, `headers off` (root package)",
		tally:      figure(ad, adok, "ns/op", "allocs/op"),
		comparison: "a fixed concurrency zone of the same size, same run: " + figure(cd, cdok, "ns/op", "allocs/op"),
		target:     "0 allocs/op",
		met:        yesNo(adok && ad.metrics["allocs/op"] == 0),
	})
	dm, dmok := m.get("BenchmarkDelayWaitingMemory")
	rows = append(rows, row{
		metric:     "Memory per request waiting for its turn, 5,000 waiting (root package BenchmarkDelayWaitingMemory)",
		tally:      figure(dm, dmok, "B/waiting-total"),
		comparison: "beyond a goroutine blocked with its request: " + figure(dm, dmok, "B/waiting"),
		target:     "bounded by queue (default 1000)",
		met:        yesNo(dmok),
	})

	local := func(bench, name string) (benchResult, bool) { return m.get(bench + "/" + name) }
	td, tok := local("BenchmarkLocalDecideParallel", "tally")
	xd, xok := local("BenchmarkLocalDecideParallel", "x-time-rate")
	gd, gok := local("BenchmarkLocalDecideParallel", "throttled")
	rows = append(rows, row{
		metric: "Decide on an existing key of 100k, all Ps, clock read per op (`tests`, same run)",
		tally:  figure(td, tok, "ns/op", "allocs/op"),
		comparison: "x/time/rate (sharded map of *rate.Limiter): " + figure(xd, xok, "ns/op", "allocs/op") +
			"; throttled/v2 GCRA + memstore: " + figure(gd, gok, "ns/op", "allocs/op"),
		target: "0 allocs/op",
		met:    yesNo(tok && td.metrics["allocs/op"] == 0),
	})
	tm, tok := local("BenchmarkLocalBytesPerKey", "tally")
	xm, xok := local("BenchmarkLocalBytesPerKey", "x-time-rate")
	gm, gok := local("BenchmarkLocalBytesPerKey", "throttled")
	rows = append(rows, row{
		metric:     "Memory per tracked key incl. its 16 B key, 100k keys (`tests`, same run)",
		tally:      figure(tm, tok, "bytes/key"),
		comparison: "x/time/rate: " + figure(xm, xok, "bytes/key") + "; throttled/v2: " + figure(gm, gok, "bytes/key"),
		target:     "≤ 96 B + key bytes (≤ 112)",
		met:        yesNo(tok && tm.metrics["state-bytes/key"] <= 96),
	})
	rows = append(rows, snapshotRows(m)...)
	rows = append(rows, strictRows(m)...)
	rows = append(rows, quotaRows(m)...)
	rows = append(rows, challengeRows(m)...)
	return append(rows, globalRows(m)...)
}

// globalRows reports the multi-region benchmarks (issue 29):
// tests/global_decision_bench_test.go and tests/global_bench_test.go.
func globalRows(m microResults) []row {
	var rows []row
	d, ok := m.get("BenchmarkGlobalDecisionRedisCPU")
	rw := row{
		metric: "Multi-region, strict: regional Redis CPU per decision of a `scope global` zone vs the same zone with `scope region` " +
			"(1,000 keys, 10 hot, 256 callers, one store; a Region at sync_interval 1s, 3 regions; 3 alternating rounds of 150,000 decisions each; `tests` BenchmarkGlobalDecisionRedisCPU, same run)",
		tally:  "not run",
		target: "≤ 1.05 by Redis CPU",
		met:    "no",
	}
	if ok {
		v := d.metrics
		rw.tally = fmt.Sprintf("**%.2f** by the whole server's CPU (INFO cpu): %s vs %s µs per decision; scripts (INFO commandstats) %s vs %s µs; "+
			"%s vs %s decisions per script call; %s vs %s of decisions allowed; the Region's fixed cost %s µs of Redis CPU per second; the global store %s µs per decision",
			v["ratio"], formatValue(v["global-redis-cpu-µs/decision"]), formatValue(v["region-redis-cpu-µs/decision"]),
			formatValue(v["global-script-µs/decision"]), formatValue(v["region-script-µs/decision"]),
			formatValue(v["global-decisions/call"]), formatValue(v["region-decisions/call"]),
			formatValue(v["global-allowed-share"]), formatValue(v["region-allowed-share"]),
			formatValue(v["region-fixed-cpu-µs/s"]), formatValue(v["global-store-cpu-µs/decision"]))
		rw.comparison = "scope region: one GCRA step per decision in the regional Redis"
		rw.met = yesNo(v["ratio"] <= 1.05)
	}
	rows = append(rows, rw)

	k, ok := m.get("BenchmarkGlobalScriptPerKey")
	rw = row{
		metric: "Multi-region, strict: gcra.lua's Redis time per key of a `scope global` zone vs `scope region` " +
			"(batches of 50 keys, every step writing; 10 hot keys at 90 % of the limit between 40 at the weight; 20 alternating rounds of 100 calls each, each scope on its own keys; `tests` BenchmarkGlobalScriptPerKey, same run)",
		tally:  "not run",
		target: "≤ 1.05 by Redis CPU",
		met:    "no",
	}
	if ok {
		v := k.metrics
		rw.tally = fmt.Sprintf("**%.2f** by the script's time (INFO commandstats): %s vs %s µs per key",
			v["ratio"], formatValue(v["global-redis-µs/key"]), formatValue(v["region-redis-µs/key"]))
		rw.comparison = "scope region: the same script with plain ops"
		rw.met = yesNo(v["ratio"] <= 1.05)
	}
	rows = append(rows, rw)

	for _, sub := range []struct{ name, what string }{
		{"steady", "the same demand every sync: only what changed is reported"},
		{"contested", "a full report of every key, each contested"},
	} {
		s, ok := m.get("BenchmarkGlobalSyncHotKeys/" + sub.name)
		rw = row{
			metric: "Multi-region: global store work for 10k hot keys reported by each of 3 regions, " + sub.what +
				" (global.lua, one sync per op; `tests` BenchmarkGlobalSyncHotKeys/" + sub.name + ")",
			tally:  "not run",
			target: "—", met: "—",
		}
		if ok {
			perSync := s.metrics["redis-µs/sync"]
			rw.tally = fmt.Sprintf("%s Redis µs per sync, %s per key: **%.4f core** of the global Redis at 1 sync/s per region × 3",
				formatValue(perSync), formatValue(s.metrics["redis-µs/key"]), perSync*3/1e6)
			rw.comparison = "a key no region pushes against costs the global store nothing"
		}
		rows = append(rows, rw)
	}

	f, ok := m.get("BenchmarkGlobalSharesFollowDemand")
	rw = row{
		metric: "Multi-region: time for a key's share to follow its demand to another region (≥ 90%), 2 regions, sync_interval 200ms, loopback (`tests` BenchmarkGlobalSharesFollowDemand, 4 moves)",
		tally:  "not run",
		target: "≤ 2 × sync_interval + the cut's margin + round trips",
		met:    "no",
	}
	if ok {
		v := f.metrics
		rw.tally = fmt.Sprintf("**%s ms** per move (%s sync intervals), longest %s ms (%s)",
			formatValue(v["ms/move"]), formatValue(v["sync-intervals/move"]), formatValue(v["max-ms/move"]), formatValue(v["max-sync-intervals/move"]))
		rw.comparison = "Doorman: a client's capacity changes at its next lease refresh (1–5 s)"
		rw.target = fmt.Sprintf("≤ 2 × sync_interval + the cut's margin (2 polls + 2 × regional timeout) + round trips: %s ms", formatValue(v["bound-ms"]))
		rw.met = yesNo(v["max-ms/move"] <= v["bound-ms"])
	}
	return append(rows, rw)
}

// snapshotRows reports zones/snapshot_bench_test.go: persist's snapshots of
// 1M keys (issue 28), and decisions while one is taken.
func snapshotRows(m microResults) []row {
	var rows []row
	for _, ks := range []struct{ name, what string }{{"ipv4", "IPv4 keys"}, {"apikey40", "40-byte API keys"}} {
		r, ok := m.get("BenchmarkSnapshot1M/" + ks.name)
		rows = append(rows, row{
			metric: "persist snapshot of 1M " + ks.what + ": take (copy + encode), write (temp file, fsync, rename), restore (check + merge), size (`zones`)",
			tally:  figure(r, ok, "snapshot-ms", "write-ms", "restore-ms", "MB"),
			target: "restore within the 2 s start bound",
			met:    yesNo(ok && r.metrics["restore-ms"] < 2000),
		})
	}
	r, ok := m.get("BenchmarkDecideDuringSnapshot")
	rows = append(rows, row{
		metric: "p99 of local decisions on a zone of 1M keys while snapshots are taken back to back vs without (`zones`, same run)",
		tally:  figure(r, ok, "p99-snapshot-ns", "p99-ns", "ratio"),
		target: "≤ 2× the p99 without",
		met:    yesNo(ok && r.metrics["ratio"] <= 2),
	})
	return rows
}

// quotaRows reports tests/quota_bench_test.go: strict-mode quota decisions
// beside GCRA decisions of the same run, by callers; issue 27's target is a
// quota decision's Redis CPU at most a GCRA decision's, at 256 callers.
func quotaRows(m microResults) []row {
	var rows []row
	for _, callers := range []string{"1", "16", "256"} {
		q, qok := m.get("BenchmarkStrictQuotaDecide/quota/callers=" + callers)
		g, gok := m.get("BenchmarkStrictQuotaDecide/gcra/callers=" + callers)
		rw := row{metric: "Strict mode: a calendar quota decision vs a GCRA decision, " + callers + " callers (`tests` BenchmarkStrictQuotaDecide, same run)",
			tally:      figure(q, qok, "decisions/s", "redis-µs/decision", "decisions/call", "p99-µs"),
			comparison: "GCRA: " + figure(g, gok, "decisions/s", "redis-µs/decision", "decisions/call", "p99-µs"),
			target:     "—", met: "—"}
		if callers == "256" {
			rw.target = "Redis µs per decision ≤ GCRA's"
			rw.met = yesNo(qok && gok && q.metrics["redis-µs/decision"] <= g.metrics["redis-µs/decision"])
		}
		rows = append(rows, rw)
	}
	return rows
}

// strictRows reports the strict-mode benchmarks of tests/store_bench_test.go:
// each tally sub-benchmark beside its go-redis/redis_rate counterpart (the
// same name with redis_rate for tally), every metric they report.
func strictRows(m microResults) []row {
	var rows []row
	for _, name := range m.order {
		if !strings.HasPrefix(name, "BenchmarkStrict") && !strings.HasPrefix(name, "BenchmarkRedisRate") ||
			strings.HasPrefix(name, "BenchmarkStrictQuotaDecide") { // quotaRows
			continue
		}
		r := m.byName[name]
		if strings.Contains(name, "/redis_rate") {
			if _, paired := m.byName[strings.Replace(name, "/redis_rate", "/tally", 1)]; paired {
				continue
			}
		}
		rw := row{metric: "Strict mode: " + strings.TrimPrefix(name, "Benchmark"), tally: figure(r, true, r.units...), target: "—", met: "—"}
		if other, ok := m.byName[strings.Replace(name, "/tally", "/redis_rate", 1)]; ok && strings.Contains(name, "/tally") {
			rw.comparison = "go-redis/redis_rate: " + figure(other, true, other.units...)
			_, callers, _ := strings.Cut(name, "/tally/")
			if t, ok := strictTargets[callers]; ok && other.metrics["decisions/s"] > 0 {
				ratio := r.metrics["decisions/s"] / other.metrics["decisions/s"]
				rw.tally = fmt.Sprintf("**%.2f×** redis_rate's decisions/s in the same run; ", ratio) + rw.tally
				rw.target = fmt.Sprintf("≥ %.1f×", t.ratio)
				met := ratio >= t.ratio
				if t.redisUs > 0 {
					rw.target += fmt.Sprintf(", ≤ %g Redis µs per decision", t.redisUs)
					met = met && r.metrics["redis-µs/decision"] <= t.redisUs
				}
				if t.p99Us > 0 {
					rw.target += fmt.Sprintf(", p99 ≤ %g µs", t.p99Us)
					met = met && r.metrics["p99-µs"] <= t.p99Us
				}
				rw.met = yesNo(met)
			}
		}
		rows = append(rows, rw)
	}
	return rows
}

// strictTargets are issue 12's targets for BenchmarkStrictDecide by
// callers: tally's decisions/s over redis_rate's in the same run, and where
// set (not 0) Redis's µs per decision and the p99 of one decision.
var strictTargets = map[string]struct{ ratio, redisUs, p99Us float64 }{
	"callers=1":   {ratio: 1.0},
	"callers=16":  {ratio: 1.5, p99Us: 1000},
	"callers=256": {ratio: 3.0, redisUs: 3},
}

func loadRow(r scenarioResult) row {
	rw := row{metric: r.metric, comparison: r.comparison, target: "≥ " + strconv.FormatFloat(r.target, 'f', 2, 64)}
	if r.custom != nil || r.standalone != nil {
		rw.target = r.targetText
	}
	if r.err != nil {
		rw.tally = "failed: " + strings.ReplaceAll(r.err.Error(), "|", "/")
		rw.met = "no"
		return rw
	}
	if r.measured != nil {
		rw.tally = r.measured.text
		rw.met = yesNo(r.measured.value <= r.target)
		if r.measured.met != nil {
			rw.met = yesNo(*r.measured.met)
		}
		if r.measured.comparison != "" {
			rw.comparison = r.measured.comparison
		}
		return rw
	}
	runs := "alternating"
	if r.simultaneous && r.baselineBinary != nil {
		runs = "simultaneous"
	}
	rw.tally = fmt.Sprintf("**%.2f** (%.0f vs %.0f req/s, medians of %d %s runs)", r.ratio(), r.candidateRate, r.baselineRate, r.runs, runs)
	if r.candidateCPU > 0 {
		rw.tally += fmt.Sprintf("; by Caddy CPU per request: %.2f (median of %d rounds, spread %s; %.1f vs %.1f µs over all rounds)", r.cpuRatio(), len(r.cpuRatios), spread(r.cpuRatios),
			float64(r.candidateCPU)/1e3, float64(r.baselineCPU)/1e3)
	}
	if r.candidateAllocs.count > 0 {
		rw.tally += fmt.Sprintf("; Caddy allocations per request: %.1f (%.0f B) vs %.1f (%.0f B)",
			r.candidateAllocs.count, r.candidateAllocs.bytes, r.baselineAllocs.count, r.baselineAllocs.bytes)
	}
	rw.met = yesNo(r.ratio() >= r.target)
	if r.byCPU && r.candidateCPU > 0 {
		rw.target += " by CPU per request"
		rw.met = yesNo(r.cpuRatio() >= r.target)
	}
	return rw
}

// figure formats the given metrics of a benchmark, e.g. "25.1 ns/op, 0 allocs/op".
func figure(r benchResult, ok bool, units ...string) string {
	if !ok {
		return "not run"
	}
	var parts []string
	for _, u := range units {
		v, has := r.metrics[u]
		if !has {
			continue
		}
		parts = append(parts, formatValue(v)+" "+u)
	}
	return strings.Join(parts, ", ")
}

func formatValue(v float64) string {
	switch {
	case v == float64(int64(v)) && v < 1e15:
		return strconv.FormatInt(int64(v), 10)
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}
