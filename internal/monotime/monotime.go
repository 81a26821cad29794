// Package monotime is tally's local clock: nanoseconds since the process
// started, read from the monotonic clock. Local decisions, deny caches,
// sweeps and sync timers use it, so a step of the wall clock (NTP, a VM
// resumed, an operator) neither refills nor blocks keys. State shared
// through Redis is timed by Redis TIME alone.
package monotime

import "time"

// start carries a monotonic reading: time.Since(start) ignores wall-clock
// steps.
var start = time.Now()

// Now is the time in nanoseconds since the process started, monotonic.
func Now() int64 { return int64(time.Since(start)) }

// Since is the monotonic time elapsed since the reading ns.
func Since(ns int64) time.Duration { return time.Duration(Now() - ns) }

// Time returns the wall-clock time of the reading ns, for display only.
func Time(ns int64) time.Time { return time.Now().Add(-Since(ns)) }
