package main

import "fmt"

// challengeRows reports the challenge's price (issue 53): what a browser
// takes to solve one (tests/challenge_browser_caddy_test.go, headless
// chromium) and what the native crawler model pays
// (tests/challenge_crawler_caddy_test.go).
func challengeRows(m microResults) []row {
	var rows []row
	for _, d := range []int{4, 5} {
		r, ok := m.get(fmt.Sprintf("BenchmarkChallengeBrowserSolve/difficulty=%d", d))
		rows = append(rows, row{
			metric:     fmt.Sprintf("Challenge at difficulty %d solved by headless chromium (the page's script, crypto.subtle), page opened to page landed, mean and slowest of 3 (`tests` BenchmarkChallengeBrowserSolve)", d),
			tally:      figure(r, ok, "solve-ms/op", "max-solve-ms"),
			comparison: "Anubis: ~7 s for headless Chrome at difficulty 5 (gan-anubis)",
			target:     "—", met: "—",
		})
	}
	r, ok := m.get("BenchmarkChallengeCrawler")
	rows = append(rows, row{
		metric:     "Crawler model: 500 loopback addresses, zone of 30/min per address, difficulty 4, native Go solver: work per solve, per page of a cookie's 600, pages/s got (`tests` BenchmarkChallengeCrawler)",
		tally:      figure(r, ok, "hashes/solve", "cpu-ms/solve", "hashes/page", "pages/s"),
		comparison: "Anubis: a native solver passes difficulty 5 in ~200 ms (gan-anubis), then a week per address",
		target:     "—", met: "—",
	})
	return rows
}
