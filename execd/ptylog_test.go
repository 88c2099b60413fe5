package execd

import (
	"bytes"
	"testing"
	"time"
)

func TestOutputLogOffsetsAndWrap(t *testing.T) {
	l := newOutputLog(8)
	l.write([]byte("abcde"), PTYStdout)
	if data, from := l.snapshot(0); string(data) != "abcde" || from != 0 {
		t.Fatalf("snapshot(0) = %q at %d", data, from)
	}
	l.write([]byte("fghij"), PTYStdout) // 10 bytes written, the ring keeps the last 8
	if got := l.Total(); got != 10 {
		t.Fatalf("total %d, want 10", got)
	}
	for _, c := range []struct {
		since    int64
		want     string
		wantFrom int64
	}{
		{0, "cdefghij", 2}, // clamped to the oldest byte kept
		{4, "efghij", 4},
		{9, "j", 9},
		{10, "", 10},
		{99, "", 10},
	} {
		data, from := l.snapshot(c.since)
		if string(data) != c.want || from != c.wantFrom {
			t.Errorf("snapshot(%d) = %q at %d, want %q at %d", c.since, data, from, c.want, c.wantFrom)
		}
	}
	// One write larger than the ring keeps its tail and counts every byte.
	l.write([]byte("0123456789AB"), PTYStdout)
	if data, from := l.snapshot(0); string(data) != "456789AB" || from != 14 || l.Total() != 22 {
		t.Fatalf("after an oversized write: %q at %d, total %d", data, from, l.Total())
	}
}

func TestOutputLogChannels(t *testing.T) {
	l := newOutputLog(1 << 10)
	l.write([]byte("out1"), PTYStdout)
	l.write([]byte("out2"), PTYStdout)
	l.write([]byte("err"), PTYStderr)
	l.write([]byte("out3"), PTYStdout)
	var got []string
	for off := int64(0); ; {
		data, ch, from, wake := l.next(off, 1<<10)
		if len(data) == 0 {
			if wake == nil {
				t.Fatal("no data and no wake-up channel")
			}
			break
		}
		got = append(got, string([]byte{'0' + ch})+":"+string(data))
		off = from + int64(len(data))
	}
	if want := []string{"1:out1out2", "2:err", "1:out3"}; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("runs %q, want %q", got, want)
	}
	if data, _, from, _ := l.next(1, 3); string(data) != "ut1" || from != 1 {
		t.Fatalf("next(1, 3) = %q at %d", data, from)
	}
}

func TestOutputLogWakesReaders(t *testing.T) {
	l := newOutputLog(64)
	_, _, _, wake := l.next(0, 64)
	go l.write([]byte("x"), PTYStdout)
	select {
	case <-wake:
	case <-time.After(10 * time.Second):
		t.Fatal("a write did not wake the waiting reader")
	}
}

// TestOutputLogFlowControl: while a client holds the session, a write that would
// overwrite output it was not sent waits until the client catches up (or goes).
func TestOutputLogFlowControl(t *testing.T) {
	l := newOutputLog(8)
	l.setHold(0)
	l.write([]byte("12345678"), PTYStdout) // fills the ring exactly: no wait
	wrote := make(chan struct{})
	go func() {
		l.write([]byte("9abc"), PTYStdout)
		close(wrote)
	}()
	select {
	case <-wrote:
		t.Fatal("a write overwrote bytes the holder was not sent")
	case <-time.After(100 * time.Millisecond):
	}
	l.setHold(2) // room for two bytes only
	select {
	case <-wrote:
		t.Fatal("the write went on with room for half of it")
	case <-time.After(100 * time.Millisecond):
	}
	if data, from := l.snapshot(0); !bytes.Equal(data, []byte("3456789a")) || from != 2 {
		t.Fatalf("after partial room: %q at %d", data, from)
	}
	l.setHold(-1) // the client went: the ring overwrites again
	select {
	case <-wrote:
	case <-time.After(10 * time.Second):
		t.Fatal("the write still waits with no holder")
	}
	if data, _ := l.snapshot(0); string(data) != "56789abc" {
		t.Fatalf("ring %q", data)
	}
	// A closed log never blocks.
	l.setHold(l.Total())
	l.write([]byte("12345678"), PTYStdout)
	l.close()
	l.write([]byte("more"), PTYStdout)
}
