package execd

import "sync"

// Channel bytes of the PTY WebSocket's binary frames (execd-pty.md, "Traffic"): the first
// byte of every binary frame.
const (
	// PTYStdin is a client's frame: the rest of the frame is written to the shell's stdin.
	PTYStdin byte = 0x00
	// PTYStdout is output: the terminal's in PTY mode, standard output in pipe mode.
	PTYStdout byte = 0x01
	// PTYStderr is standard error, in pipe mode only.
	PTYStderr byte = 0x02
	// PTYReplay is output sent again on (re)connect: an 8-byte big-endian offset (of the
	// frame's first byte in the session's output) follows, then the bytes.
	PTYReplay byte = 0x03
)

// PTYReplayBytes is how much of a PTY session's most recent output execd keeps for
// replay (since=): 1 MiB. Offsets keep counting past it; older bytes are gone.
const PTYReplayBytes = 1 << 20

// maxSegments bounds the channel bookkeeping of a pipe-mode log (one entry per switch
// between stdout and stderr). Past it the oldest switches are forgotten: their bytes are
// then sent live as the channel of the entry before them, which only a reader lagging far
// behind can see.
const maxSegments = 1 << 16

// segment says that the bytes from off on (to the next segment) came on channel ch.
type segment struct {
	off int64
	ch  byte
}

// outputLog is a PTY session's output: a ring of the last `size` bytes addressed by
// absolute offsets (total counts every byte ever written), the channel of each byte
// range, a wake-up for readers and flow control for the connected client.
//
// Flow control: while a client holds the session (hold >= 0, the offset up to which it
// was sent output), write blocks rather than overwrite bytes that client has not been
// sent yet, so a slow terminal slows the shell down as a real one does; without a client
// the ring simply overwrites its oldest bytes.
type outputLog struct {
	mu     sync.Mutex
	cond   sync.Cond // signalled when hold moves or the log closes
	size   int
	buf    []byte // grows up to size; byte at offset o is at buf[o%size] once full
	total  int64
	segs   []segment
	wake   chan struct{} // closed (and replaced) by every write; nil until a reader waits
	hold   int64         // -1: no client
	closed bool
}

func newOutputLog(size int) *outputLog {
	l := &outputLog{size: size, hold: -1}
	l.cond.L = &l.mu
	return l
}

// write appends p as output of channel ch. It blocks while the holding client has not
// been sent the bytes p would overwrite (see outputLog), and returns at once once the log
// is closed.
func (l *outputLog) write(p []byte, ch byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(p) > 0 && !l.closed {
		n := len(p)
		if l.hold >= 0 {
			room := int64(l.size) - (l.total - l.hold)
			if room <= 0 {
				l.cond.Wait()
				continue
			}
			n = int(min(int64(n), room))
		}
		l.appendLocked(p[:n], ch)
		p = p[n:]
	}
}

func (l *outputLog) appendLocked(p []byte, ch byte) {
	if len(p) > l.size {
		l.total += int64(len(p) - l.size)
		p = p[len(p)-l.size:]
	}
	if k := len(l.segs); k == 0 || l.segs[k-1].ch != ch {
		l.segs = append(l.segs, segment{off: l.total, ch: ch})
	}
	for len(p) > 0 {
		if len(l.buf) < l.size {
			// Still growing: the ring has not wrapped, so total == len(buf).
			n := min(len(p), l.size-len(l.buf))
			l.buf = append(l.buf, p[:n]...)
			l.total += int64(n)
			p = p[n:]
			continue
		}
		i := int(l.total % int64(l.size))
		n := copy(l.buf[i:], p)
		l.total += int64(n)
		p = p[n:]
	}
	oldest := l.oldestLocked()
	drop := 0
	for drop+1 < len(l.segs) && l.segs[drop+1].off <= oldest {
		drop++
	}
	if len(l.segs)-drop > maxSegments {
		drop = len(l.segs) - maxSegments/2
	}
	if drop > 0 {
		l.segs = append(l.segs[:0], l.segs[drop:]...)
	}
	if l.wake != nil {
		close(l.wake)
		l.wake = nil
	}
}

func (l *outputLog) oldestLocked() int64 { return max(0, l.total-int64(l.size)) }

// copyLocked returns the bytes [from, to) (both within the ring).
func (l *outputLog) copyLocked(from, to int64) []byte {
	out := make([]byte, 0, to-from)
	for from < to {
		i := int(from % int64(l.size))
		n := int(min(to-from, int64(len(l.buf)-i)))
		out = append(out, l.buf[i:i+n]...)
		from += int64(n)
	}
	return out
}

// Total is the offset of the next byte: how many bytes the session has output.
func (l *outputLog) Total() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// snapshot returns the output from since (clamped to the oldest byte kept) up to now and
// the offset of its first byte; empty when since is at or past the end.
func (l *outputLog) snapshot(since int64) ([]byte, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	from := max(since, l.oldestLocked())
	if from >= l.total {
		return nil, l.total
	}
	return l.copyLocked(from, l.total), from
}

// next returns at most max bytes of one channel from offset from on (clamped to the
// oldest byte kept), the channel and the offset of the first byte. With nothing to read
// it returns no bytes and a channel closed by the next write.
func (l *outputLog) next(from int64, max int) ([]byte, byte, int64, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if from < l.oldestLocked() {
		from = l.oldestLocked()
	}
	if from >= l.total {
		if l.wake == nil {
			l.wake = make(chan struct{})
		}
		return nil, 0, from, l.wake
	}
	ch, end := PTYStdout, l.total
	for _, s := range l.segs {
		if s.off > from {
			end = s.off
			break
		}
		ch = s.ch
	}
	if end-from > int64(max) {
		end = from + int64(max)
	}
	return l.copyLocked(from, end), ch, from, nil
}

// setHold records that the holding client was sent the output up to off (-1: no client
// holds the session any more) and lets a blocked write go on.
func (l *outputLog) setHold(off int64) {
	l.mu.Lock()
	l.hold = off
	l.mu.Unlock()
	l.cond.Broadcast()
}

// close ends flow control for good: writes no longer wait (the session is going).
func (l *outputLog) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.cond.Broadcast()
}
