package llmreq

// A minimal reader of JSON text: the body's top-level members are found
// and their values skipped in one pass, without decoding them, so that a
// megabyte of messages costs one scan and no allocation. It accepts every
// valid JSON value; on invalid text it stops (-1), and the body is then
// left as it is.

// space skips JSON whitespace from i.
func space(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// str skips the string that starts at b[i] (a quote): the index after its
// closing quote, or -1.
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

// value skips the value that starts at b[i]: the index after it, or -1.
// text, when not nil, is added the bytes inside the value's strings that
// are not object keys: the text of a prompt.
func value(b []byte, i int, text *int64) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		e := str(b, i)
		if e > 0 && text != nil {
			*text += int64(e - i - 2)
		}
		return e
	case '{', '[':
		// The open brackets, a bit each (1: an object), to tell a key
		// from a value; nesting beyond maxDepth is not read.
		var open [maxDepth / 64]uint64
		depth, key := 0, false
		for ; i < len(b); i++ {
			switch b[i] {
			case '{', '[':
				if depth == maxDepth {
					return -1
				}
				obj := b[i] == '{'
				if obj {
					open[depth/64] |= 1 << (depth % 64)
				} else {
					open[depth/64] &^= 1 << (depth % 64)
				}
				depth, key = depth+1, obj
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			case ',':
				key = open[(depth-1)/64]&(1<<((depth-1)%64)) != 0
			case ':':
				key = false
			case '"':
				e := str(b, i)
				if e < 0 {
					return -1
				}
				if !key && text != nil {
					*text += int64(e - i - 2)
				}
				i = e - 1
			}
		}
		return -1
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

// maxDepth is the deepest nesting value reads.
const maxDepth = 512

// members calls f with each member of the object at b[i:] (its key, raw,
// between the quotes, and its value's span b[vs:ve]). The index
// after the object, or -1 when b[i:] does not start with an object.
func members(b []byte, i int, f func(key []byte, vs, ve int)) int {
	i = space(b, i)
	if i >= len(b) || b[i] != '{' {
		return -1
	}
	i = space(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1
	}
	for i < len(b) {
		if b[i] != '"' {
			return -1
		}
		ke := str(b, i)
		if ke < 0 {
			return -1
		}
		key := b[i+1 : ke-1]
		i = space(b, ke)
		if i >= len(b) || b[i] != ':' {
			return -1
		}
		vs := space(b, i+1)
		ve := value(b, vs, nil)
		if ve < 0 {
			return -1
		}
		f(key, vs, ve)
		i = space(b, ve)
		if i >= len(b) {
			return -1
		}
		switch b[i] {
		case ',':
			i = space(b, i+1)
		case '}':
			return i + 1
		default:
			return -1
		}
	}
	return -1
}
