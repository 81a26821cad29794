package algorithms

import (
	"fmt"
	"time"
)

// Period is a calendar period of a quota: N per minute, hour, day, ISO week
// or month, reset when the period of the quota's time zone ends.
//
// A period is the longest stretch of time over which the zone's wall clock
// shows the same minute, hour, date, ISO week or month. So a Berlin day is
// 23 hours long on the last Sunday of March and 25 on the last Sunday of
// October; a month has its real length; a week starts on Monday at 00:00
// (ISO 8601); where clocks go back an hour, the hour they repeat is one
// period of two hours (its label, say 02:00-03:00, is the same throughout)
// and where they go forward an hour, the hour skipped has no period. Every
// time zone in use has an offset of a whole number of minutes, so minutes
// are the same in every zone.
type Period uint8

// The periods, shortest first.
const (
	Minute Period = iota + 1
	Hour
	Day
	Week
	Month
)

// ParsePeriod reads "minute", "hour", "day", "week" or "month".
func ParsePeriod(s string) (Period, error) {
	for p := Minute; p <= Month; p++ {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("unknown period %q: use minute, hour, day, week or month", s)
}

var periodNames = [...]string{Minute: "minute", Hour: "hour", Day: "day", Week: "week", Month: "month"}

func (p Period) String() string {
	if p < Minute || p > Month {
		return fmt.Sprintf("Period(%d)", uint8(p))
	}
	return periodNames[p]
}

// maxZoneSegments bounds how many offset changes Bounds walks across: a
// period spans at most two or three (a month with both of a year's DST
// switches does not exist; Lord Howe's half-hour switches are two a year).
const maxZoneSegments = 8

// Bounds returns the period of loc that contains t: [start, end), in loc;
// end - start is the period's real length.
func (p Period) Bounds(t time.Time, loc *time.Location) (start, end time.Time) {
	t = t.In(loc)
	label := p.label(t)
	// Within one offset segment the wall clock is a fixed-offset clock, on
	// which the period's edges are plain calendar arithmetic. Where an edge
	// falls on or beyond the segment's, the period goes on into the next
	// segment if the wall clock still shows the same label there (a
	// repeated hour, a midnight that comes twice), else ends with it.
	start = t
	for range maxZoneSegments {
		seg, _ := start.ZoneBounds()
		s, _ := p.fixedBounds(start)
		if seg.IsZero() || s.After(seg) {
			start = s
			break
		}
		before := seg.Add(-time.Nanosecond)
		if p.label(before) != label {
			start = seg
			break
		}
		start = before
	}
	end = t
	for range maxZoneSegments {
		_, seg := end.ZoneBounds()
		_, e := p.fixedBounds(end)
		if seg.IsZero() || e.Before(seg) {
			end = e
			break
		}
		if p.label(seg) != label {
			end = seg
			break
		}
		end = seg
	}
	return start.In(loc), end.In(loc)
}

// label is what the wall clock shows of t at p's resolution: the wall
// clock's start of its period on a fixed-offset clock (minutes: UTC
// minutes, as offsets are whole minutes: the wall clock repeats its minutes
// when it goes back, the instants do not). Two instants with the same label
// and no other label between them are in one period.
type label struct {
	year              int
	month             time.Month
	day, hour, minute int
}

func (p Period) label(t time.Time) label {
	start, _ := p.fixedBounds(t)
	if p == Minute {
		start = start.UTC()
	}
	y, m, d := start.Date()
	return label{y, m, d, start.Hour(), start.Minute()}
}

// fixedBounds is p's period containing t on a clock whose offset is t's
// throughout.
func (p Period) fixedBounds(t time.Time) (start, end time.Time) {
	_, off := t.Zone()
	f := t.In(time.FixedZone("", off))
	y, m, d := f.Date()
	switch p {
	case Minute:
		start = t.Truncate(time.Minute)
		return start, start.Add(time.Minute)
	case Hour:
		start = time.Date(y, m, d, f.Hour(), 0, 0, 0, f.Location())
		return start, start.Add(time.Hour)
	case Day:
		start = time.Date(y, m, d, 0, 0, 0, 0, f.Location())
		return start, time.Date(y, m, d+1, 0, 0, 0, 0, f.Location())
	case Week:
		back := (int(f.Weekday()) + 6) % 7 // days since Monday
		start = time.Date(y, m, d-back, 0, 0, 0, 0, f.Location())
		return start, time.Date(y, m, d-back+7, 0, 0, 0, 0, f.Location())
	}
	start = time.Date(y, m, 1, 0, 0, 0, 0, f.Location())
	return start, time.Date(y, m+1, 1, 0, 0, 0, 0, f.Location())
}
