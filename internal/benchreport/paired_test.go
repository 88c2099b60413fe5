package benchreport

import (
	"slices"
	"testing"
)

// TestPaired: the sides take turns, off first in even pairs and on first in odd ones,
// and each ratio is its own pair's on/off.
func TestPaired(t *testing.T) {
	var order []bool
	figure := 0.0
	off, on, ratios := Paired(3, func(side bool) float64 {
		order = append(order, side)
		figure++
		return figure
	})
	if want := []bool{false, true, true, false, false, true}; !slices.Equal(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
	if !slices.Equal(off, []float64{1, 4, 5}) || !slices.Equal(on, []float64{2, 3, 6}) ||
		!slices.Equal(ratios, []float64{2, 0.75, 1.2}) {
		t.Errorf("off %v on %v ratios %v", off, on, ratios)
	}
}

// TestMedian: the middle value (the upper middle of an even count), v untouched.
func TestMedian(t *testing.T) {
	v := []float64{3, 1, 4, 2}
	if m := Median(v); m != 3 {
		t.Errorf("Median %v = %v, want 3", v, m)
	}
	if !slices.Equal(v, []float64{3, 1, 4, 2}) {
		t.Errorf("Median changed its argument: %v", v)
	}
	if m := Median([]float64{5, 1, 9}); m != 5 {
		t.Errorf("Median of 5,1,9 = %v", m)
	}
	if Median(nil) != 0 {
		t.Error("Median of none is not 0")
	}
}
