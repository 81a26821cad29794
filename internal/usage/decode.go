package usage

import (
	"bytes"
	"math"
	"math/bits"
)

// decoder is a resumable JSON tokenizer that keeps only what finding the
// paths needs: the open containers (at most MaxDepth), the key and number
// being read. It checks the structure (a cut or broken document does not
// finish), not tokens' details (escapes, numbers) beyond finding their end.
type decoder struct {
	paths *Paths
	state state
	depth int
	// Per open container: whether it is an array, and the paths whose keys
	// match the keys down to it: bit i is path i from the root, bit slots+i
	// path i from below a top-level key (Anthropic's message, Responses').
	array [MaxDepth]bool
	match [MaxDepth]uint64
	// The member being read: its key (up to maxSegment), the paths it continues.
	key     [maxSegment]byte
	keyLen  int
	escaped bool // the key or string holds a backslash escape
	member  uint64
	// The number being read, when a path ends at it.
	num    int64
	digits bool // num holds only digits so far

	vals  [2 * slots]int64 // by bit
	found uint64
	done  bool // the top-level value ended
	err   bool
	// A token scanner's reads a top-level array as a list of documents
	// (Gemini's stream without alt=sse); feed stops at each one's end (done).
	inList bool

	// The last string of each text mask (its first MaxModel bytes, escapes
	// as written), and where the string being read goes (0: none, k+1: text[k]).
	text    [2][MaxModel]byte
	textLen [2]int
	capture int
}

// slots is how many paths a decoder follows: a charge's or the token scanner's.
const slots = 32

type state uint8

const (
	sValue      state = iota // before a value
	sKeyOrEnd                // after '{'
	sKey                     // before a key, after ','
	sInKey                   // in a key
	sKeyEscape               // after a backslash in a key (each escape follows its state)
	sColon                   // after a key
	sInString                // in a string value
	sEscape                  // after a backslash in a string value
	sNumber                  // in a number
	sLiteral                 // in true, false or null
	sAfter                   // after a value
	sValueOrEnd              // after '['
)

func (d *decoder) reset(p *Paths) {
	*d = decoder{paths: p}
	all := uint64(1)<<len(p.segs) - 1
	d.member = all | all<<slots // the document's root continues every path
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// next readies d for a list's next document, once the last was taken.
func (d *decoder) next() {
	d.reset(d.paths)
	d.inList, d.state = true, sAfter
}

func (d *decoder) docEnded() bool { return d.inList && d.done }

// feed reads b's next bytes and says how many: fewer only where a list's
// document ended.
func (d *decoder) feed(b []byte) int {
	i := 0
	for ; i < len(b) && !d.err && !d.docEnded(); i++ {
		c := b[i]
		switch d.state {
		case sValue, sValueOrEnd:
			switch {
			case isSpace(c):
			case c == ']' && d.state == sValueOrEnd:
				d.close(true)
			default:
				d.value(c)
			}
		case sKeyOrEnd, sKey:
			switch {
			case isSpace(c):
			case c == '"':
				d.state, d.keyLen, d.escaped = sInKey, 0, false
			case c == '}' && d.state == sKeyOrEnd:
				d.close(false)
			default:
				d.err = true
			}
		case sColon:
			switch {
			case isSpace(c):
			case c == ':':
				d.member = d.continues()
				d.state = sValue
			default:
				d.err = true
			}
		case sInKey, sInString: // the run without a quote or backslash is read at once
			j := len(b)
			if k := bytes.IndexAny(b[i:], `"\\`); k >= 0 {
				j = i + k
			}
			d.keep(b[i:j])
			switch i = j; {
			case i == len(b):
			case b[i] == '\\':
				d.keep(b[i : i+1])
				d.escaped, d.state = true, d.state+1 // to its escape
			case d.state == sInKey:
				d.state = sColon
			default:
				d.capture = 0
				d.afterValue()
			}
		case sKeyEscape, sEscape:
			d.keep(b[i : i+1])
			d.state--
		case sNumber:
			switch {
			case c >= '0' && c <= '9':
				if d.num > (math.MaxInt64-9)/10 {
					d.num = math.MaxInt64 // saturated: charges are capped far below
				} else {
					d.num = d.num*10 + int64(c-'0')
				}
			case c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E':
				d.digits = false
			default:
				d.endNumber()
				i-- // c follows the number
			}
		case sLiteral:
			if c < 'a' || c > 'z' {
				d.afterValue()
				i--
			}
		case sAfter:
			switch {
			case isSpace(c):
			case c == ',' && d.depth == 0 && d.inList:
				d.state = sValue
			case c == ',' && d.depth > 0:
				if d.array[d.depth-1] {
					d.state, d.member = sValue, 0
				} else {
					d.state = sKey
				}
			case c == '}' || c == ']':
				d.close(c == ']')
			default:
				d.err = true
			}
		}
	}
	return i
}

// value starts the value whose first byte is c.
func (d *decoder) value(c byte) {
	if d.done {
		d.err = true // a second top-level value
		return
	}
	switch {
	case c == '[' && d.paths.tokens && !d.inList && d.depth == 0:
		d.inList, d.state = true, sValueOrEnd // d.member stays the root's
	case c == '{' || c == '[':
		if d.depth == MaxDepth {
			d.err = true
			return
		}
		if c == '{' {
			d.array[d.depth], d.match[d.depth], d.state = false, d.member&^d.ends(), sKeyOrEnd
		} else {
			d.array[d.depth], d.match[d.depth], d.state, d.member = true, 0, sValueOrEnd, 0
		}
		d.depth++
	case c == '"':
		d.state = sInString
		if e := d.ends(); e&d.paths.text[0] != 0 {
			d.capture, d.textLen[0] = 1, 0
		} else if e&d.paths.text[1] != 0 {
			d.capture, d.textLen[1] = 2, 0
		}
	case c == '-' || (c >= '0' && c <= '9'):
		d.state, d.num, d.digits = sNumber, 0, c != '-'
		if c != '-' {
			d.num = int64(c - '0')
		}
	case c >= 'a' && c <= 'z':
		d.state = sLiteral
	default:
		d.err = true
	}
}

// bitPath is bit b's path and the keys before it (0: from the root, 1: below one).
func (d *decoder) bitPath(b int) (segs []string, skip int) {
	if b < slots {
		return d.paths.segs[b], 0
	}
	return d.paths.segs[b-slots], 1
}

// keep adds b, the next bytes of a key or string, to where it goes, as room allows.
func (d *decoder) keep(b []byte) {
	switch {
	case d.state == sInKey || d.state == sKeyEscape:
		if d.keyLen <= maxSegment {
			copy(d.key[d.keyLen:], b)
		}
		d.keyLen += len(b)
	case d.capture != 0:
		k := d.capture - 1
		d.textLen[k] += copy(d.text[k][d.textLen[k]:], b)
	}
}

// ends are the paths among the member's that end at its value.
func (d *decoder) ends() uint64 {
	var e uint64
	for m := d.member; m != 0; m &= m - 1 {
		b := bits.TrailingZeros64(m)
		if segs, skip := d.bitPath(b); len(segs)+skip == d.depth {
			e |= 1 << b
		}
	}
	return e
}

// continues is the paths of the object whose key at this depth is the key
// just read (any key, at the top level a path from below one skips).
func (d *decoder) continues() uint64 {
	readable := !d.escaped && d.keyLen <= maxSegment
	var c uint64
	for m := d.match[d.depth-1]; m != 0; m &= m - 1 {
		b := bits.TrailingZeros64(m)
		segs, skip := d.bitPath(b)
		if i := d.depth - 1 - skip; i < 0 || (readable && segs[i] == string(d.key[:d.keyLen])) {
			c |= 1 << b
		}
	}
	return c
}

// pathValue is path i's value in the document, found from the root first.
func (d *decoder) pathValue(i int) (int64, bool) {
	for _, b := range [2]int{i, slots + i} {
		if d.found&(1<<b) != 0 {
			return d.vals[b], true
		}
	}
	return 0, false
}

// endNumber ends a number: a whole one >= 0 is the value of the paths ending at it.
func (d *decoder) endNumber() {
	if d.digits {
		for e := d.ends(); e != 0; e &= e - 1 {
			b := bits.TrailingZeros64(e)
			d.vals[b], d.found = d.num, d.found|1<<b
		}
	}
	d.afterValue()
}

// close ends the innermost container, an array or an object.
func (d *decoder) close(array bool) {
	switch {
	case d.depth == 0 && d.inList && array:
		d.inList = false
	case d.depth == 0 || d.array[d.depth-1] != array:
		d.err = true
		return
	default:
		d.depth--
	}
	d.afterValue()
}

// afterValue ends a value, noting the top-level one's end.
func (d *decoder) afterValue() {
	d.state = sAfter
	if d.depth == 0 {
		d.done = true
	}
}

// finish reports whether the document ended complete and well formed. A
// space ends a number or literal at the very end, which no byte followed.
func (d *decoder) finish() bool {
	d.feed([]byte{' '})
	return !d.err && d.done && !d.inList && d.state == sAfter
}
