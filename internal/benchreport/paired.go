package benchreport

import (
	"runtime"
	"slices"
	"syscall"
)

// Paired measures two sides n times in pairs, back to back, the order alternating
// (off first in the even pairs, on first in the odd), so that load that comes and goes
// on the machine falls on both sides alike: measure(false) and measure(true) return
// one run's figure of each side (a rate: higher is better). It returns each side's
// figures in run order and each pair's on/off ratio.
func Paired(n int, measure func(on bool) float64) (off, on, ratios []float64) {
	for k := range n {
		var a, b float64
		if k%2 == 1 {
			b = measure(true)
			a = measure(false)
		} else {
			a = measure(false)
			b = measure(true)
		}
		off, on, ratios = append(off, a), append(on, b), append(ratios, b/a)
	}
	return off, on, ratios
}

// Median is the middle value of v (of an even count, the upper of the two middle
// ones); v is left as it is. 0 for none.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

// Settle starts a run of a bench on a machine the run before it left alone: a
// collected heap (none pays the garbage collector for the one before) and no dirty
// pages (a run that writes files leaves hundreds of MB for the kernel to write back,
// which a later run's fsync would wait for and its CPU would share with).
func Settle() {
	runtime.GC()
	syscall.Sync()
}
