package execd

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// maxLine is the longest line sent as one event; longer lines are cut into pieces of
// this size, so a command's output is never held whole in memory.
const maxLine = 64 << 10

// splitLines reads r to its end and calls emit once per line with the terminator ("\n"
// or "\r\n") stripped. A final line without terminator is emitted too. It returns the
// first read error other than io.EOF (a closed pipe counts as the end).
func splitLines(r io.Reader, emit func(line string)) error {
	br := bufio.NewReaderSize(r, maxLine)
	for {
		b, err := br.ReadSlice('\n')
		switch {
		case err == nil:
			b = bytes.TrimSuffix(b[:len(b)-1], []byte{'\r'})
			emit(string(b))
		case errors.Is(err, bufio.ErrBufferFull):
			emit(string(b))
		default:
			if len(b) > 0 {
				emit(string(b))
			}
			if errors.Is(err, io.EOF) || errors.Is(err, errClosedPipe) {
				return nil
			}
			return err
		}
	}
}
