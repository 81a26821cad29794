package distributed

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// redisReply is an error reply from Redis, as go-redis types them.
type redisReply string

func (e redisReply) Error() string { return string(e) }
func (redisReply) RedisError()     {}

// An outage is one WARN line and one INFO line, whatever the heartbeat does
// meanwhile. A beat that succeeds while tally's calls are refused to its ACL
// user (the beat uses none of the commands refused) proves nothing about
// them: before this, it ended the outage, and the next calls logged a second
// WARN (seen as 2 WARN lines in TestTLSAndACLMistakesAreOneClearErrorThenTheFailPolicy
// on a loaded machine, where the first beat lands among the first calls).
// A beat that succeeds after calls found no Redis ends the outage as before.
func TestHeartbeatEndsOnlyAnOutageItCanSeeEnd(t *testing.T) {
	refused := redisReply("ERR The user executing the script can't run this command or subcommand script: 1, on @user_script:214.")
	for _, c := range []struct {
		name    string
		err     error
		beatEnd bool // a successful beat ends the outage
	}{
		{"refused to the ACL user", refused, false},
		{"NOPERM", redisReply("NOPERM User tally has no permissions to run the 'set' command"), false},
		{"no answer", errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			b := &breaker{logger: zap.New(core), redis: "redis://127.0.0.1:1"}
			call := func(probe bool, err error) {
				t.Helper()
				if ok, p := b.allow(); !ok || p != probe {
					t.Fatalf("allow: %v, probe %v; want a call, probe %v", ok, p, probe)
				}
				b.record(probe, err)
			}
			beat := func(err error) {
				if ok, probe := b.allow(); ok {
					b.recordBeat(probe, err)
				}
			}
			call(false, c.err)
			beat(nil) // between the first and second failure: the count starts over only if it ends the outage
			call(false, c.err)
			if c.beatEnd {
				call(false, c.err) // the count started over at the beat
			}
			if n := logs.FilterLevelExact(zapcore.WarnLevel).Len(); n != 1 {
				t.Fatalf("%d WARN lines after two failed calls in a row, want 1", n)
			}
			beat(nil) // among the outage's calls
			if c.beatEnd {
				if n := logs.FilterLevelExact(zapcore.InfoLevel).Len(); n != 1 {
					t.Fatalf("%d INFO lines after a beat ended an outage of no answer, want 1", n)
				}
				return
			}
			for state := b.state.Load(); state == stateClosed; state = b.state.Load() {
				call(false, c.err)
			}
			b.mu.Lock()
			b.retryAt = time.Now() // the cool-down is over: the next call probes
			b.mu.Unlock()
			beat(nil) // the probe, as a beat: no verdict
			if b.closed() {
				t.Fatal("a beat closed the breaker while tally's calls are refused to its user")
			}
			call(true, c.err) // the next call probes, and is refused
			if n := logs.Len(); n != 1 {
				t.Fatalf("%d lines during an outage the beats cannot see end, want its one WARN: %v", n, logs.All())
			}
			b.mu.Lock()
			b.retryAt = time.Now()
			b.mu.Unlock()
			call(true, nil) // fixed: the probe succeeds
			if n := logs.FilterLevelExact(zapcore.InfoLevel).Len(); n != 1 {
				t.Fatalf("%d INFO lines once a call succeeded again, want 1", n)
			}
		})
	}
}
