// Package benchreport measures operations side by side and prints them with ratios, the
// one format every `make bench` figure uses:
//
//	BENCH <suite> <name>: n=<count> p50=<dur> p99=<dur> rate=<ops/s>
//	RATIO <suite> <what>: <value> (target <op> <target>)
//
// Side-by-side benchmarks are tests named TestBench* gated by testenv.NeedBench; they
// measure both sides in the same run so the ratio is not skewed by a different machine
// state.
package benchreport

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Sample is a set of latencies of one operation and the wall time they took together.
type Sample struct {
	Name      string
	Latencies []time.Duration
	Wall      time.Duration
}

// Quantile returns the q-quantile (0..1) of the latencies, 0 when empty.
func (s Sample) Quantile(q float64) time.Duration {
	if len(s.Latencies) == 0 {
		return 0
	}
	l := slices.Clone(s.Latencies)
	slices.Sort(l)
	i := int(q * float64(len(l)-1))
	return l[i]
}

// Rate returns operations per second over the wall time.
func (s Sample) Rate() float64 {
	if s.Wall <= 0 {
		return 0
	}
	return float64(len(s.Latencies)) / s.Wall.Seconds()
}

// Measure runs op n times sequentially and records each latency. It stops at the first
// error and returns it.
func Measure(name string, n int, op func() error) (Sample, error) {
	s := Sample{Name: name, Latencies: make([]time.Duration, 0, n)}
	start := time.Now()
	for range n {
		t0 := time.Now()
		if err := op(); err != nil {
			return s, fmt.Errorf("%s: %w", name, err)
		}
		s.Latencies = append(s.Latencies, time.Since(t0))
	}
	s.Wall = time.Since(start)
	return s, nil
}

// MeasureParallel runs op n times spread over workers goroutines and records each
// latency; the wall time covers the whole run, so Rate is the aggregate throughput.
func MeasureParallel(name string, workers, n int, op func() error) (Sample, error) {
	var (
		mu       sync.Mutex
		lat      = make([]time.Duration, 0, n)
		firstErr error
		next     = make(chan struct{}, n)
		wg       sync.WaitGroup
	)
	for range n {
		next <- struct{}{}
	}
	close(next)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			local := make([]time.Duration, 0, n/workers+1)
			for range next {
				t0 := time.Now()
				if err := op(); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				local = append(local, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		})
	}
	wg.Wait()
	s := Sample{Name: name, Latencies: lat, Wall: time.Since(start)}
	if firstErr != nil {
		return s, fmt.Errorf("%s: %w", name, firstErr)
	}
	return s, nil
}

// Out is where reports go; stdout by default so `go test -v` shows them.
var Out io.Writer = os.Stdout

// Print writes one BENCH line for s.
func Print(suite string, s Sample) {
	fmt.Fprintf(Out, "BENCH %s %s: n=%d p50=%s p99=%s rate=%.0f/s\n",
		suite, s.Name, len(s.Latencies), round(s.Quantile(0.5)), round(s.Quantile(0.99)), s.Rate())
}

// Ratio writes one RATIO line. op is the comparison the target expects ("≥" or "≤");
// pass target 0 when there is none.
func Ratio(suite, what string, value float64, op string, target float64) {
	if target == 0 {
		fmt.Fprintf(Out, "RATIO %s %s: %.3f\n", suite, what, value)
		return
	}
	verdict := "met"
	if (op == "≥" && value < target) || (op == "≤" && value > target) {
		verdict = "MISSED"
	}
	fmt.Fprintf(Out, "RATIO %s %s: %.3f (target %s %.2f: %s)\n", suite, what, value, op, target, verdict)
}

// Value writes one free-form figure (memory, sizes) as a BENCH line.
func Value(suite, what string, format string, args ...any) {
	fmt.Fprintf(Out, "BENCH %s %s: %s\n", suite, what, fmt.Sprintf(format, args...))
}

func round(d time.Duration) time.Duration {
	switch {
	case d > time.Second:
		return d.Round(time.Millisecond)
	case d > time.Millisecond:
		return d.Round(time.Microsecond)
	default:
		return d.Round(100 * time.Nanosecond)
	}
}

// ProcessCPU is the CPU time (user and system) the calling process has used, its
// threads' work in the kernel included: a bench reads it around a measured part to
// give that part's CPU cost beside its wall-clock rate.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// List formats v comma-separated with prec decimals, for the per-round figures a
// BENCH line prints.
func List(v []float64, prec int) string {
	b := make([]byte, 0, len(v)*(prec+4))
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendFloat(b, x, 'f', prec, 64)
	}
	return string(b)
}
