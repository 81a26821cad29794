package algorithms

import (
	"testing"
	"time"
	_ "time/tzdata" // the table holds wherever the tests run
)

// The table is derived by hand from the zones' rules (2026: Europe switches
// on the last Sundays of March and October at 01:00 UTC; New York on the
// second Sunday of March and the first of November at 02:00 local; Cuba at
// midnight; Lord Howe by half an hour at 02:00 local), not by the code.
func TestPeriodBoundsFollowTheWallClock(t *testing.T) {
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tests := []struct {
		name       string
		period     Period
		zone       string
		at         string
		start, end string
	}{
		{"UTC day", Day, "UTC", "2026-03-15T10:00:00Z", "2026-03-15T00:00:00Z", "2026-03-16T00:00:00Z"},
		{"UTC day at its first instant", Day, "UTC", "2026-03-15T00:00:00Z", "2026-03-15T00:00:00Z", "2026-03-16T00:00:00Z"},
		{"UTC day at its last nanosecond", Day, "UTC", "2026-03-15T23:59:59.999999999Z", "2026-03-15T00:00:00Z", "2026-03-16T00:00:00Z"},
		{"Berlin day in winter", Day, "Europe/Berlin", "2026-01-10T23:30:00Z", "2026-01-10T23:00:00Z", "2026-01-11T23:00:00Z"},
		{"Berlin day of 23 hours", Day, "Europe/Berlin", "2026-03-29T12:00:00Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z"},
		{"Berlin day of 23 hours, before the switch", Day, "Europe/Berlin", "2026-03-29T00:30:00Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z"},
		{"Berlin day of 25 hours", Day, "Europe/Berlin", "2026-10-25T12:00:00Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z"},
		{"Berlin day of 25 hours, in the repeated hour", Day, "Europe/Berlin", "2026-10-25T00:30:00Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z"},
		{"New York day of 23 hours", Day, "America/New_York", "2026-03-08T12:00:00Z", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"},
		{"New York day of 25 hours", Day, "America/New_York", "2026-11-01T12:00:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"},
		{"New York day before the fall switch", Day, "America/New_York", "2026-11-01T03:59:59Z", "2026-10-31T04:00:00Z", "2026-11-01T04:00:00Z"},
		{"Havana day that starts at 01:00", Day, "America/Havana", "2026-03-08T12:00:00Z", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"},
		{"Havana day before the midnight switch", Day, "America/Havana", "2026-03-08T04:59:59Z", "2026-03-07T05:00:00Z", "2026-03-08T05:00:00Z"},
		{"Havana day whose midnight comes twice", Day, "America/Havana", "2026-11-01T04:30:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"},
		{"Havana day whose midnight comes twice, the second time", Day, "America/Havana", "2026-11-01T05:30:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"},
		{"ISO week across a new year", Week, "UTC", "2026-01-01T12:00:00Z", "2025-12-29T00:00:00Z", "2026-01-05T00:00:00Z"},
		{"ISO week from its Sunday", Week, "UTC", "2026-01-04T23:59:59Z", "2025-12-29T00:00:00Z", "2026-01-05T00:00:00Z"},
		{"ISO week from its Monday", Week, "UTC", "2026-01-05T00:00:00Z", "2026-01-05T00:00:00Z", "2026-01-12T00:00:00Z"},
		{"Berlin week with the spring switch", Week, "Europe/Berlin", "2026-03-25T12:00:00Z", "2026-03-22T23:00:00Z", "2026-03-29T22:00:00Z"},
		{"New York week with the fall switch", Week, "America/New_York", "2026-11-01T12:00:00Z", "2026-10-26T04:00:00Z", "2026-11-02T05:00:00Z"},
		{"February", Month, "UTC", "2026-02-14T00:00:00Z", "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"},
		{"February of a leap year", Month, "UTC", "2028-02-29T23:00:00Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z"},
		{"December into January", Month, "UTC", "2026-12-31T23:59:59Z", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"},
		{"Berlin March, an hour short", Month, "Europe/Berlin", "2026-03-31T21:59:59Z", "2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z"},
		{"Berlin April from its first instant", Month, "Europe/Berlin", "2026-03-31T22:00:00Z", "2026-03-31T22:00:00Z", "2026-04-30T22:00:00Z"},
		{"Berlin month's end in local time", Month, "Europe/Berlin", "2026-01-31T23:30:00Z", "2026-01-31T23:00:00Z", "2026-02-28T23:00:00Z"},
		{"New York November, an hour long", Month, "America/New_York", "2026-11-15T00:00:00Z", "2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z"},
		{"New York October's last evening", Month, "America/New_York", "2026-11-01T03:00:00Z", "2026-10-01T04:00:00Z", "2026-11-01T04:00:00Z"},
		{"Berlin hour repeated: two hours", Hour, "Europe/Berlin", "2026-10-25T00:30:00Z", "2026-10-25T00:00:00Z", "2026-10-25T02:00:00Z"},
		{"Berlin hour repeated, the second time", Hour, "Europe/Berlin", "2026-10-25T01:30:00Z", "2026-10-25T00:00:00Z", "2026-10-25T02:00:00Z"},
		{"Berlin hour before the skipped one", Hour, "Europe/Berlin", "2026-03-29T00:30:00Z", "2026-03-29T00:00:00Z", "2026-03-29T01:00:00Z"},
		{"Berlin hour after the skipped one", Hour, "Europe/Berlin", "2026-03-29T01:00:00Z", "2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z"},
		{"Kolkata hour at half past UTC", Hour, "Asia/Kolkata", "2026-06-01T10:10:00Z", "2026-06-01T09:30:00Z", "2026-06-01T10:30:00Z"},
		{"Lord Howe hour that gains half an hour", Hour, "Australia/Lord_Howe", "2026-04-04T14:45:00Z", "2026-04-04T14:00:00Z", "2026-04-04T15:30:00Z"},
		{"Lord Howe hour that gains half an hour, after", Hour, "Australia/Lord_Howe", "2026-04-04T15:10:00Z", "2026-04-04T14:00:00Z", "2026-04-04T15:30:00Z"},
		{"minute across the fall switch", Minute, "Europe/Berlin", "2026-10-25T00:59:30Z", "2026-10-25T00:59:00Z", "2026-10-25T01:00:00Z"},
		{"minute after the fall switch", Minute, "Europe/Berlin", "2026-10-25T01:00:10Z", "2026-10-25T01:00:00Z", "2026-10-25T01:01:00Z"},
		{"minute in Kathmandu (+05:45)", Minute, "Asia/Kathmandu", "2026-06-01T10:10:59.5Z", "2026-06-01T10:10:00Z", "2026-06-01T10:11:00Z"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			loc, err := time.LoadLocation(tc.zone)
			if err != nil {
				t.Fatal(err)
			}
			start, end := tc.period.Bounds(utc(tc.at), loc)
			if !start.Equal(utc(tc.start)) || !end.Equal(utc(tc.end)) {
				t.Errorf("%v of %s in %s = [%v, %v), want [%s, %s)", tc.period, tc.at, tc.zone,
					start.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339), tc.start, tc.end)
			}
			if start.Location() != loc || end.Location() != loc {
				t.Errorf("bounds are in %v and %v, want %v", start.Location(), end.Location(), loc)
			}
		})
	}
}

// Periods tile time: each ends where the next starts, and every instant is
// in exactly the period whose bounds it gets, across a year of a zone with
// DST, at random instants and at every boundary.
func TestPeriodsTileTime(t *testing.T) {
	for _, zone := range []string{"UTC", "Europe/Berlin", "America/New_York", "America/Havana", "Australia/Lord_Howe", "Asia/Kathmandu"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		for p := Minute; p <= Month; p++ {
			from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			to := from.AddDate(1, 0, 0)
			if p <= Hour {
				to = from.AddDate(0, 0, 3) // and around the switches below
			}
			check := func(at time.Time) {
				t.Helper()
				s, e := p.Bounds(at, loc)
				if at.Before(s) || !at.Before(e) {
					t.Fatalf("%s %v: %v is not in its bounds [%v, %v)", zone, p, at, s, e)
				}
				if ns, ne := p.Bounds(e, loc); !ns.Equal(e) || !ne.After(e) {
					t.Fatalf("%s %v: the period after [%v, %v) is [%v, %v)", zone, p, s, e, ns, ne)
				}
				if ps, pe := p.Bounds(s.Add(-time.Nanosecond), loc); !pe.Equal(s) || !ps.Before(s) {
					t.Fatalf("%s %v: the period before [%v, %v) is [%v, %v)", zone, p, s, e, ps, pe)
				}
				if l := e.Sub(s); l < p.shortest() || l > p.longest() {
					t.Fatalf("%s %v: [%v, %v) lasts %v", zone, p, s, e, l)
				}
			}
			for at := from; at.Before(to); {
				check(at)
				_, e := p.Bounds(at, loc)
				at = e
			}
			// Around each of the year's offset changes.
			for at := from; at.Before(from.AddDate(1, 0, 0)); {
				_, next := at.In(loc).ZoneBounds()
				if next.IsZero() {
					break
				}
				for _, d := range []time.Duration{-2 * time.Hour, -time.Hour, -time.Minute, -time.Nanosecond, 0, time.Nanosecond, time.Minute, time.Hour, 2 * time.Hour} {
					check(next.Add(d))
				}
				at = next
			}
		}
	}
}

func (p Period) shortest() time.Duration {
	return map[Period]time.Duration{Minute: time.Minute, Hour: 30 * time.Minute, Day: 23 * time.Hour, Week: 7*24*time.Hour - time.Hour, Month: 28*24*time.Hour - time.Hour}[p]
}

func (p Period) longest() time.Duration {
	return map[Period]time.Duration{Minute: time.Minute, Hour: 2 * time.Hour, Day: 25 * time.Hour, Week: 7*24*time.Hour + time.Hour, Month: 31*24*time.Hour + time.Hour}[p]
}

func TestParsePeriod(t *testing.T) {
	for p := Minute; p <= Month; p++ {
		if got, err := ParsePeriod(p.String()); err != nil || got != p {
			t.Errorf("ParsePeriod(%q) = %v, %v", p.String(), got, err)
		}
	}
	for _, bad := range []string{"", "year", "Month", "days", "1h"} {
		if _, err := ParsePeriod(bad); err == nil {
			t.Errorf("ParsePeriod(%q) accepted", bad)
		}
	}
}
