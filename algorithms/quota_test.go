package algorithms

import (
	"math"
	"testing"
)

func TestQuotaCountsUntilTheLimit(t *testing.T) {
	q := Quota{Limit: 3}
	used := int64(0)
	for i, want := range []bool{true, true, true, false, false} {
		r := q.Decide(used, 1)
		if r.Allowed != want {
			t.Fatalf("request %d: allowed %v, want %v", i+1, r.Allowed, want)
		}
		used = r.Used
	}
	if used != 3 {
		t.Errorf("used %d after 3 admissions and 2 denials, want 3", used)
	}
	// A weighted request needs room for all of its cost; cost 0 passes.
	if r := q.Decide(1, 3); r.Allowed || r.Used != 1 || r.Remaining != 2 {
		t.Errorf("cost 3 with 2 left: %+v, want denied, used 1, remaining 2", r)
	}
	if r := q.Decide(1, 2); !r.Allowed || r.Used != 3 || r.Remaining != 0 {
		t.Errorf("cost 2 with 2 left: %+v, want allowed, used 3, remaining 0", r)
	}
	if r := q.Decide(3, 0); !r.Allowed || r.Used != 3 {
		t.Errorf("cost 0 on a spent quota: %+v, want allowed", r)
	}
	if r := q.Refund(3, 2); r.Used != 1 || r.Remaining != 2 {
		t.Errorf("refund 2 of 3: %+v", r)
	}
	if r := q.Refund(1, 2); r.Used != 0 {
		t.Errorf("refund below 0: %+v", r)
	}
	if r := q.Decide(math.MaxInt64-1, 5); r.Allowed {
		t.Errorf("a cost that overflows the sum was allowed: %+v", r)
	}
}

// Post-charged quotas: a key is checked with a unit left, charged in full
// after the response, and can end a period in debt by at most one charge.
func TestQuotaChargeCapsTheDebtAtOneCharge(t *testing.T) {
	q := Quota{Limit: 100}
	if r := q.Check(99); !r.Allowed {
		t.Error("check with 1 unit left was denied")
	}
	if r := q.Check(100); r.Allowed {
		t.Error("check with nothing left was allowed")
	}
	r := q.Charge(99, 30) // checked with 1 left, charged 30
	if r.Used != 129 || r.Allowed || r.Remaining != 0 {
		t.Errorf("charge 30 at 99/100: %+v, want used 129, denied", r)
	}
	// Requests in flight when the quota ran out: each charge counts from
	// the limit, not from the debt before it.
	for range 10 {
		r = q.Charge(r.Used, 30)
	}
	if r.Used != 130 {
		t.Errorf("ten more charges of 30 left used %d, want 130 (the limit and one charge)", r.Used)
	}
	if r := q.Charge(10, 20); r.Used != 30 || !r.Allowed || r.Remaining != 70 {
		t.Errorf("charge 20 at 10/100: %+v", r)
	}
}
