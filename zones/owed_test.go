package zones

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-tally/ratelimit/internal/monotime"
)

// outageStore is a strict store that is down until up is set: its decides
// then answer from a GCRA table, as Redis would, and its charges (the owed
// charges a reconciliation sends) are recorded and answered chargeErr.
type outageStore struct {
	up        atomic.Bool
	chargeErr error
	table     *Table
	mu        sync.Mutex
	charges   []owedSent
}

type owedSent struct {
	key  string
	cost int64
}

var errOutage = errors.New("redis: connection refused")

func (s *outageStore) Rate(_ context.Context, _, key string, st RateStep) (RateReply, error) {
	if !s.up.Load() {
		return RateReply{}, errOutage
	}
	switch st.Op {
	case OpDecide:
		return RateReply{Result: s.table.Decide(key, monotime.Now(), st.Limit, st.Cost, st.Ahead)}, nil
	case OpCharge:
		s.mu.Lock()
		s.charges = append(s.charges, owedSent{key, st.Cost})
		s.mu.Unlock()
		if s.chargeErr != nil {
			return RateReply{}, s.chargeErr
		}
		return RateReply{Result: s.table.Charge(key, monotime.Now(), st.Limit, st.Cost)}, nil
	}
	return RateReply{}, nil
}

func (s *outageStore) Quota(context.Context, string, string, QuotaStep) (QuotaResult, error) {
	return QuotaResult{}, errOutage
}

func (s *outageStore) Instances() int { return 1 }

func (s *outageStore) Offers() Offers { return Offers{Mode: "strict"} }

func (s *outageStore) sent() []owedSent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]owedSent(nil), s.charges...)
}

// hearFromStore makes the zone hear from its store once (a decision of a
// key of its own, which owes nothing) and waits for the reconciliation that
// answer starts, if any, to end.
func hearFromStore(t *testing.T, z *Zone, key string) {
	t.Helper()
	if d := z.Decide(context.Background(), key, monotime.Now()); d.Source != SourceStore {
		t.Fatalf("decision of %s with the store up: %+v, want the store's", key, d)
	}
	// The reconciliation was started, if at all, before Decide returned;
	// the tests queue no charges, so it is the zone's only charger.
	z.state.chargers.Wait()
}

// An owed charge that timed out may have run in the store: it is never
// sent again, however often the store answers afterwards (charging it twice
// would take the key's quota twice for one outage). A charge the store
// refused without running it is sent again, which shows that the later
// answers did start reconciliations.
func TestOwedChargeThatTimedOutIsNeverSentAgain(t *testing.T) {
	for _, tc := range []struct {
		name      string
		chargeErr error
		want      int // times the owed charge is sent
	}{
		{"timed out: sent once", context.DeadlineExceeded, 1},
		{"refused: sent again, up to its attempts", errOutage, owedAttempts},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Name: "z", Events: 10, Window: time.Hour, FailPolicy: FailLocal}
			st := &outageStore{chargeErr: tc.chargeErr, table: NewTable(100)}
			z := mustNew(c, newTestState(t, c), st)
			if d := z.Decide(context.Background(), "alice", monotime.Now()); !d.Allowed || d.Source != SourceFailLocal {
				t.Fatalf("alice during the outage: %+v, want admitted by fail_policy local", d)
			}
			st.up.Store(true)
			for range owedAttempts + 3 {
				hearFromStore(t, z, "bob")
			}
			sent := st.sent()
			if len(sent) != tc.want {
				t.Fatalf("owed charges sent: %v, want alice's charge of 1 sent %d time(s)", sent, tc.want)
			}
			for _, s := range sent {
				if s != (owedSent{"alice", 1}) {
					t.Fatalf("owed charges sent: %v, want only alice's charge of 1", sent)
				}
			}
		})
	}
}

// One key's refund of its outage admission (a later zone denied the
// request) leaves what other keys owe: when the store answers again, their
// outage admissions are charged, and the refunded key's is not.
func TestOwedChargesOfOtherKeysArePaidAfterOneKeysRefund(t *testing.T) {
	c := Config{Name: "z", Events: 10, Window: time.Hour, FailPolicy: FailLocal}
	st := &outageStore{table: NewTable(100)}
	z := mustNew(c, newTestState(t, c), st)
	ctx := context.Background()
	now := monotime.Now()
	p := z.Plan()
	for range 3 {
		if d := z.Decide(ctx, "alice", now); !d.Allowed || d.Source != SourceFailLocal {
			t.Fatalf("alice during the outage: %+v, want admitted by fail_policy local", d)
		}
	}
	d := z.Decide(ctx, "bob", now)
	if !d.Allowed || d.Source != SourceFailLocal {
		t.Fatalf("bob during the outage: %+v, want admitted by fail_policy local", d)
	}
	if _, err := z.RefundWith(ctx, "bob", now, d, &p, 1); err != nil {
		t.Fatalf("refund of bob's outage admission: %v", err)
	}
	st.up.Store(true)
	hearFromStore(t, z, "carol")
	if sent := st.sent(); len(sent) != 1 || sent[0] != (owedSent{"alice", 3}) {
		t.Fatalf("owed charges sent once the store answered: %v, want alice's 3 alone (bob's was refunded)", sent)
	}
	// Alice's outage admissions count in the store: 7 of her 10 are left.
	if r := st.table.Peek("alice", monotime.Now(), p.limit); !r.Allowed || r.Remaining != 7 {
		t.Fatalf("alice in the store after the reconciliation: %+v, want 7 remaining", r)
	}
}

// A post-charge whose retries ran out during an outage is owed, not lost:
// when the store answers again, it is sent.
func TestPostChargeThatOutlivedItsRetriesIsSentWhenTheStoreIsBack(t *testing.T) {
	c := Config{Name: "z", Events: 10, Window: time.Hour, FailPolicy: FailLocal}
	st := &outageStore{table: NewTable(100)}
	z := mustNew(c, newTestState(t, c), st)
	failed := make(chan error, 1)
	z.OnChargeFailed = func(err error) { failed <- err }
	p := z.Plan()
	z.Charge(context.Background(), "alice", monotime.Now(), &p, 3)
	select {
	case <-failed: // its retries ran out
	case <-time.After(ChargeRetryFor + 5*time.Second):
		t.Fatal("the charge was not reported failed after its retries")
	}
	st.up.Store(true)
	// The chargers run on, so hearFromStore's wait for them would not
	// end: poll for the charge instead.
	if d := z.Decide(context.Background(), "bob", monotime.Now()); d.Source != SourceStore {
		t.Fatalf("bob with the store up: %+v, want the store's decision", d)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(st.sent()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling what the store received
	}
	if sent := st.sent(); len(sent) != 1 || sent[0] != (owedSent{"alice", 3}) {
		t.Fatalf("charges sent once the store was back: %v, want alice's 3", sent)
	}
}

// What a key owes is capped at two bursts however often it is added to:
// a debt of 3 bursts noted twice is sent as 2 bursts.
func TestOwedChargeIsCappedAtTwoBursts(t *testing.T) {
	c := Config{Name: "z", Events: 10, Window: time.Hour, FailPolicy: FailLocal}
	st := &outageStore{table: NewTable(100)}
	z := mustNew(c, newTestState(t, c), st)
	p := z.Plan()
	for range 2 {
		z.owe("alice", &p, 3*p.Burst)
	}
	st.up.Store(true)
	hearFromStore(t, z, "bob")
	if sent := st.sent(); len(sent) != 1 || sent[0] != (owedSent{"alice", MaxCharge * p.Burst}) {
		t.Fatalf("owed charges sent: %v, want alice's %d (two bursts)", sent, MaxCharge*p.Burst)
	}
}
