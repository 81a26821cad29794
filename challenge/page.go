package challenge

import (
	"crypto/sha256"
	_ "embed" // the page's script
	"encoding/base64"
	"fmt"
	"html"
	"math"
	"strconv"
	"time"
)

// script is the page's inline script, a constant that a strict CSP allows
// by its hash (ScriptHash). It reads the challenge from the meta element,
// finds the nonce (crypto.subtle in a secure context, its own SHA-256
// elsewhere) and POSTs it, whose 303 returns to the page's path and query.
//
//go:embed solver.js
var script string

// ScriptHash is the CSP source that allows the page's script: 'sha256-…'.
var ScriptHash = func() string {
	sum := sha256.Sum256([]byte(script))
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}()

// BrowserHashRate is the hashes per second a browser is assumed to try.
const BrowserHashRate = 100000

// Page is the challenge page for token at difficulty d; retry is for
// clients without JavaScript.
func Page(token string, d int, retry time.Duration) []byte {
	return fmt.Appendf(nil, `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex">
<title>Checking your browser</title>
<meta name="tally-challenge" content="%s" data-difficulty="%d" data-action="%s">
</head>
<body>
<h1>One moment</h1>
<p>This site limits how fast its pages are fetched. Your browser is doing a small computation to continue, which may take %s; the page then loads by itself.</p>
<p id="tally-status" role="status">Working.</p>
<noscript><p>This check needs JavaScript. Without it, try again in %s.</p></noscript>
<script>%s</script>
</body>
</html>
`, html.EscapeString(token), d, VerifyPath, howLong(ExpectedHashes(d)/BrowserHashRate), howLong(retry.Seconds()), script)
}

// howLong says a number of seconds in words.
func howLong(s float64) string {
	switch {
	case s < 2:
		return "a second or two"
	case s < 120:
		return "about " + strconv.Itoa(int(math.Ceil(s))) + " seconds"
	default:
		return "about " + strconv.Itoa(int(math.Ceil(s/60))) + " minutes"
	}
}
