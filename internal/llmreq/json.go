package llmreq

// A minimal JSON reader: the top-level members are found and their values skipped,
// undecoded, in one pass with no allocation. It accepts every valid value nested
// at most maxDepth deep; on invalid text it stops (-1), the body left as it is.

// maxDepth is the deepest nesting value reads.
const maxDepth = 512

// space skips JSON whitespace from i.
func space(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// str skips the string at b[i] (a quote): the index after its closing quote, or -1.
func str(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// value skips the value at b[i], within depth containers: the index after
// it, or -1. text, if not nil, is added the bytes in its strings but keys:
// a prompt's text.
func value(b []byte, i int, text *int64, depth int) int {
	if i >= len(b) || depth == maxDepth && (b[i] == '{' || b[i] == '[') {
		return -1
	}
	switch b[i] {
	case '"':
		e := str(b, i)
		if e > 0 && text != nil {
			*text += int64(e - i - 2)
		}
		return e
	case '{':
		return object(b, i, text, depth+1, nil)
	case '[':
		return list(b, i, ']', func(i int) int { return value(b, i, text, depth+1) })
	}
	// A number, true, false or null: up to the next delimiter.
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\n' && b[j] != '\r' && b[j] != '\t' {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// list reads the container at b[i] closed by end, each element by elem: the
// index after, or -1.
func list(b []byte, i int, end byte, elem func(i int) int) int {
	if i = space(b, i+1); i < len(b) && b[i] == end {
		return i + 1
	}
	for i < len(b) {
		if i = elem(i); i < 0 {
			return -1
		}
		if i = space(b, i); i >= len(b) {
			return -1
		}
		switch b[i] {
		case ',':
			i = space(b, i+1)
		case end:
			return i + 1
		default:
			return -1
		}
	}
	return -1
}

// members calls f with each member of the object at b[i:] (its raw key and
// its value's span b[vs:ve]): the index after the object, or -1.
func members(b []byte, i int, f func(key []byte, vs, ve int)) int { return object(b, i, nil, 0, f) }

// object is members, its values skipped at depth, f optional.
func object(b []byte, i int, text *int64, depth int, f func(key []byte, vs, ve int)) int {
	if i = space(b, i); i >= len(b) || b[i] != '{' {
		return -1
	}
	return list(b, i, '}', func(i int) int {
		ke := str(b, i)
		if b[i] != '"' || ke < 0 {
			return -1
		}
		c := space(b, ke)
		if c >= len(b) || b[c] != ':' {
			return -1
		}
		vs := space(b, c+1)
		ve := value(b, vs, text, depth)
		if ve >= 0 && f != nil {
			f(b[i+1:ke-1], vs, ve)
		}
		return ve
	})
}
