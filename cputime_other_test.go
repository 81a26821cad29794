//go:build !unix

package ratelimit

// cpuTime is 0 where the process's CPU time is not read: the benchmarks'
// cpu-ns/op then reads 0.
func cpuTime() int64 { return 0 }
