package llmreq

import (
	"bytes"

	"github.com/caddy-tally/ratelimit/internal/usage"
)

// Strip removes from an OpenAI chat-completions stream what asking for its usage
// added: the usage-only chunk (a data event with a usage, no choices) and other
// chunks' "usage": null, so a client that did not ask gets the stream it would
// have had. An event passes once whole (a client reads nothing from half of one);
// one longer than usage.MaxEvent cannot be the usage chunk and passes as it comes.
type Strip struct {
	pending []byte
	long    bool // the event being read is longer than usage.MaxEvent
}

// Write filters b, the stream's next bytes, passing what is sent to emit.
func (s *Strip) Write(b []byte, emit func([]byte) error) error {
	s.pending = append(s.pending, b...)
	for {
		end := eventEnd(s.pending)
		if end < 0 {
			if !s.long && len(s.pending) <= usage.MaxEvent {
				return nil
			}
			// Too long to be the usage chunk: on as it comes, but for the
			// last bytes, which may start the blank line that ends it.
			s.long = true
			keep := min(len(s.pending), 3)
			err := emit(s.pending[:len(s.pending)-keep])
			s.pending = append(s.pending[:0], s.pending[len(s.pending)-keep:]...)
			return err
		}
		ev := s.pending[:end]
		if !s.long {
			ev = filter(ev)
		}
		s.long = false
		var err error
		if len(ev) > 0 {
			err = emit(ev)
		}
		s.pending = s.pending[:copy(s.pending, s.pending[end:])]
		if err != nil {
			return err
		}
	}
}

// End passes on what is left of a stream that ended within an event.
func (s *Strip) End(emit func([]byte) error) error {
	if len(s.pending) == 0 {
		return nil
	}
	err := emit(s.pending)
	s.pending = s.pending[:0]
	return err
}

// eventEnd is the index after the blank line (LF, CRLF or CR) ending b's
// first event, or -1.
func eventEnd(b []byte) int {
	end := -1
	for _, sep := range [...]string{"\n\n", "\r\n\r\n", "\r\r"} {
		if i := bytes.Index(b, []byte(sep)); i >= 0 && (end < 0 || i+len(sep) < end) {
			end = i + len(sep)
		}
	}
	return end
}

// filter is ev as the client gets it: nil for the usage chunk, "usage":
// null removed from any other chunk; other shapes pass as they are.
func filter(ev []byte) []byte {
	rest, ok := bytes.CutPrefix(ev, []byte("data:"))
	if !ok {
		return ev
	}
	at := space(ev, len(ev)-len(rest))
	// The usage member: where the member before it ends (the brace if
	// none), and its value.
	from, vs, ve := 0, 0, 0
	choices, last := false, at+1
	end := members(ev, at, func(key []byte, s, e int) {
		switch string(key) {
		case "usage":
			from, vs, ve = last, s, e
		case "choices":
			v := ev[s:e]
			choices = string(v) != "null" && !emptyArray(v)
		}
		last = e
	})
	switch {
	case end < 0 || ve == 0 || string(ev[vs:ve]) != "null" && choices:
		return ev
	case string(ev[vs:ve]) != "null":
		return nil // the usage chunk
	}
	// "usage": null goes with the comma before it or, when first, the one after it.
	to := ve
	if from == at+1 {
		if i := space(ev, ve); ev[i] == ',' {
			to = space(ev, i+1)
		}
	} else {
		from = space(ev, from)
	}
	return concat(ev[:from], "", ev[to:])
}

func emptyArray(v []byte) bool {
	return len(v) >= 2 && v[0] == '[' && space(v, 1) == len(v)-1
}
