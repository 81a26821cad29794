// Package usage reads numbers, such as an LLM server's token usage, from a
// response body (JSON or server-sent events) as it streams, in one pass and
// in memory bounded whatever the body's size. It imports nothing of Caddy.
//
// A path is a dot path of object keys (usage.total_tokens) from the root or,
// failing that, under a top-level key (Anthropic's message_start, Responses'
// response.completed); its value, a whole number >= 0, not in an array. The
// paths are summed, all or none. A JSON document counts once parsed to its
// end; each event's data is a document, and each path takes the last event
// that carries it (a sum may span events); other events ("[DONE]") are skipped.
// StartTokens (tokens.go) reads token usage with no path.
package usage

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Limits of what a scanner reads.
const (
	// MaxPaths is how many paths one charge may sum.
	MaxPaths = 8
	// MaxDepth is how deeply a JSON document may nest: deeper is malformed.
	MaxDepth = 64
	// MaxEvent is the most of one event's data kept: larger is parsed as it comes.
	MaxEvent = 64 << 10
	// MaxModel is the most of a model's name kept (Tokens, llmreq's Request).
	MaxModel = 256

	maxSegment = 128 // the longest key a path may name
)

// Paths are the dot paths a charge sums, checked once.
type Paths struct {
	segs   [][]string
	quoted [][]byte  // each path's last key, quoted: an event without one skips parsing
	text   [2]uint64 // the decoder's bits of the paths whose strings are kept: model, type
	// The token scanner's: documents are read by takeTokens, a top-level
	// array is a list of documents, NDJSON is read.
	tokens bool
}

// ParsePaths checks and keeps paths, each a dot path of object keys.
func ParsePaths(paths []string) (Paths, error) {
	switch {
	case len(paths) == 0:
		return Paths{}, errors.New("no path: give one such as usage.total_tokens")
	case len(paths) > MaxPaths:
		return Paths{}, fmt.Errorf("%d paths: at most %d may be summed", len(paths), MaxPaths)
	}
	var p Paths
	for _, path := range paths {
		segs := strings.Split(path, ".")
		for _, s := range segs {
			switch {
			case s == "":
				return Paths{}, fmt.Errorf("path %q has an empty key: write object keys joined by dots, such as usage.total_tokens", path)
			case len(s) > maxSegment:
				return Paths{}, fmt.Errorf("path %q has a key longer than %d bytes", path, maxSegment)
			case strings.ContainsAny(s, "\"\\ \t\r\n"):
				return Paths{}, fmt.Errorf("path %q: keys may not hold quotes, backslashes or spaces", path)
			case s == "$" || strings.ContainsAny(s, "[]*{}"):
				// Each would be read as a key no body has: the zone
				// would charge its fallback on every response.
				return Paths{}, fmt.Errorf("path %q can never match: only dot paths of object keys are read, from the root (no $), without array indexes, wildcards or placeholders: write e.g. usage.total_tokens", path)
			}
		}
		if len(segs) > MaxDepth {
			return Paths{}, fmt.Errorf("path %q is deeper than %d keys", path, MaxDepth)
		}
		p.segs = append(p.segs, segs)
		p.quoted = append(p.quoted, []byte(`"`+segs[len(segs)-1]+`"`))
	}
	return p, nil
}

// Reason says why a scanner has no total.
type Reason uint8

const (
	OK        Reason = iota
	NoUsage          // the body ended without every path's value
	Malformed        // the JSON that should carry the values did not parse
	TooLarge         // an event bigger than MaxEvent did not parse, and no total was found
	Encoded          // the body is compressed (Content-Encoding): not scanned
	NotJSON          // neither application/json nor text/event-stream: not scanned
)

var reasons = [...]string{"ok", "no_usage", "malformed", "too_large", "encoded", "not_json"}

func (r Reason) String() string { return reasons[r] }

// Reasons are the names of the reasons a scanner may give, OK excepted.
func Reasons() []string { return reasons[1:] }

type kind uint8

const (
	unknown kind = iota
	jsonBody
	eventBody
	lineBody // newline-delimited JSON: each line a document (token scanners only)
)

// Scanner reads one response body's total; Start readies it.
type Scanner struct {
	paths  *Paths
	kind   kind
	reason Reason // why the body is skipped, OK if it is not
	dec    decoder

	// buf: the event's data (dataLen bytes, \n after each line), then the
	// line so far.
	buf       []byte
	dataLen   int
	lineLen   int  // the current line's length, kept or not
	over      bool // the current event is larger than MaxEvent: parsed as it comes
	sawOver   bool // some such event did not parse
	field     int8 // over: the line is data (1), not (-1), or its first 6 bytes, in buf, will say
	malformed bool // some document that could carry a path did not parse
	afterCR   bool // the last byte was \r: a \n next ends nothing
	started   bool // past the first line (and a byte order mark it began with)

	vals  [MaxPaths]int64
	found uint16 // bit i: vals[i] is known

	tok tokenState
}

// Start readies s for a body with these headers.
func (s *Scanner) Start(p *Paths, contentType, contentEncoding string) {
	*s = Scanner{paths: p, buf: s.buf[:0]}
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.TrimSpace(mt)
	switch {
	case contentEncoding != "" && !strings.EqualFold(contentEncoding, "identity"):
		s.reason = Encoded
	case strings.EqualFold(mt, "text/event-stream"):
		s.kind = eventBody
	case strings.EqualFold(mt, "application/json") || (len(mt) > 5 && strings.EqualFold(mt[len(mt)-5:], "+json")):
		s.kind = jsonBody
		s.dec.reset(p)
	case p.tokens && strings.EqualFold(mt, "application/x-ndjson"):
		s.kind = lineBody
	default:
		s.reason = NotJSON
	}
}

// Write reads the body's next bytes.
func (s *Scanner) Write(b []byte) {
	switch s.kind {
	case jsonBody:
		s.parse(b)
	case eventBody, lineBody:
		s.events(b)
	}
}

// Total is the sum of the paths' values once the body has ended, or why not.
func (s *Scanner) Total() (int64, Reason) {
	all := uint16(1)<<len(s.paths.segs) - 1
	if r := s.end(func() bool { return s.found == all }); r != OK {
		return 0, r
	}
	var sum int64
	for _, v := range s.vals[:len(s.paths.segs)] {
		sum = satAdd(sum, v)
	}
	return sum, OK
}

// end takes the document the body ended with: OK when done says so, else why not.
func (s *Scanner) end(done func() bool) Reason {
	switch {
	case s.reason != OK:
		return s.reason
	case s.kind == jsonBody:
		s.endDocument(&s.malformed)
		s.kind = unknown // taken once
	case s.kind == lineBody:
		s.endLine()
	}
	switch {
	case done():
		return OK
	case s.malformed:
		return Malformed
	case s.sawOver:
		return TooLarge
	}
	return NoUsage
}

// take reads a parsed document's values (or token usage) as the latest.
func (s *Scanner) take(d *decoder) {
	if s.paths.tokens {
		s.takeTokens(d)
		return
	}
	for i := range len(s.paths.segs) {
		if v, ok := d.pathValue(i); ok {
			s.vals[i], s.found = v, s.found|1<<i
		}
	}
}

// events scans a chunk of an event stream (the HTML standard's format):
// lines end with \r\n, \n or \r; an empty line dispatches the event; a data
// line's value (after "data:" and one optional space) joins its data; other
// lines are dropped; an event cut by the stream's end is not. NDJSON lines
// end with \n, each a document.
func (s *Scanner) events(b []byte) {
	ends := "\r\n"
	if s.kind == lineBody {
		ends = "\n"
	}
	for len(b) > 0 {
		if s.afterCR {
			s.afterCR = false
			if b[0] == '\n' {
				b = b[1:]
				continue
			}
		}
		i := bytes.IndexAny(b, ends)
		if i < 0 {
			s.appendLine(b)
			return
		}
		s.appendLine(b[:i])
		s.afterCR = b[i] == '\r'
		s.endLine()
		b = b[i+1:]
	}
}

// appendLine adds b to the current line or, past MaxEvent, parses it.
func (s *Scanner) appendLine(b []byte) {
	s.lineLen += len(b)
	if !s.over && len(s.buf)+len(b) > MaxEvent {
		s.over, s.field = true, int8(s.kind-eventBody) // an NDJSON line is data
		s.dataLen = max(s.dataLen, int(s.field)*len(s.buf))
		s.dec.reset(s.paths)
		s.parse(s.buf[:s.dataLen])
		s.buf, s.dataLen = append(s.buf[:0], s.buf[s.dataLen:]...), 0
	}
	for s.over && s.field == 0 && len(s.buf) < 6 && len(b) > 0 {
		s.buf, b = append(s.buf, b[0]), b[1:]
	}
	switch {
	case s.over:
		s.feed(b, false)
	case len(b) > 0:
		if s.buf == nil {
			s.buf = make([]byte, 0, 4<<10)
		}
		s.buf = append(s.buf, b...)
	}
}

// feed parses b, more of a line of an event over MaxEvent, if the line is
// data, as its first 6 bytes (kept in buf; all of them at its end) say.
func (s *Scanner) feed(b []byte, end bool) {
	if p := s.buf; s.field == 0 && (len(p) >= 6 || end) {
		s.field = -1
		if bytes.HasPrefix(p, []byte("data")) && (len(p) == 4 || p[4] == ':') {
			s.field = 1
			s.parse(bytes.TrimPrefix(p[min(5, len(p)):], []byte(" ")))
		}
	}
	if s.field > 0 {
		s.parse(b)
	}
}

func (s *Scanner) endLine() {
	if s.kind == lineBody {
		s.dispatch(s.buf)
		s.buf, s.over = s.buf[:0], false
		return
	}
	line := s.buf[s.dataLen:]
	empty := s.lineLen == 0
	if !s.started && !s.over {
		line = bytes.TrimPrefix(line, []byte("\xef\xbb\xbf"))
		empty = len(line) == 0
	}
	s.started, s.lineLen = true, 0
	switch {
	case empty:
		s.dispatch(s.buf[:s.dataLen])
		s.buf, s.dataLen, s.over = s.buf[:0], 0, false
	case s.over: // a line of it
		s.feed([]byte{'\n'}, true)
		s.buf, s.field = s.buf[:0], 0
	case bytes.HasPrefix(line, []byte("data")) && (len(line) == 4 || line[4] == ':'):
		v := line[min(5, len(line)):]
		if len(v) > 0 && v[0] == ' ' {
			v = v[1:]
		}
		n := copy(s.buf[s.dataLen:], v) // v lies at or after dataLen: copied down
		s.buf = append(s.buf[:s.dataLen+n], '\n')
		s.dataLen += n + 1
	default: // another field, or a comment
		s.buf = s.buf[:s.dataLen]
	}
}

// dispatch parses one event's data (or NDJSON line) if it may carry a path
// or count; an event over MaxEvent was parsed as it came.
func (s *Scanner) dispatch(data []byte) {
	switch {
	case s.over:
		s.endDocument(&s.sawOver)
	case slices.ContainsFunc(s.paths.quoted, func(k []byte) bool { return bytes.Contains(data, k) }):
		s.dec.reset(s.paths)
		s.parse(data)
		s.endDocument(&s.malformed)
	}
}

// parse feeds b to the decoder, taking each of a list's documents as it ends.
func (s *Scanner) parse(b []byte) {
	for {
		n := s.dec.feed(b)
		if !s.dec.docEnded() {
			return
		}
		s.take(&s.dec)
		s.dec.next()
		b = b[n:]
	}
}

// endDocument takes the document that ended if it parsed, else sets failed.
func (s *Scanner) endDocument(failed *bool) {
	if s.dec.finish() {
		s.take(&s.dec)
	} else {
		*failed = true
	}
}

// satAdd is a + b, at most math.MaxInt64 (both are >= 0).
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
