package execdaudit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"mime"
	"mime/multipart"
	"strconv"
	"sync"
)

// maxUploadFiles is the most files of one upload whose facts are kept.
const maxUploadFiles = 1024

// uploadedFile is one file of a multipart upload as it went by.
type uploadedFile struct {
	path, mode, owner, group string
	size                     int64
	sha256                   string
	// complete: the file part ended (size and sha256 are the whole file's).
	complete bool
}

// uploadParser reads an upload body (execd's multipart form: a metadata JSON part, then
// a file part, per file) as the proxy reads it: the bytes go through a pipe to a
// goroutine that parses the parts and hashes each file, so nothing is held but the
// metadata part (64 KiB at most). A body it cannot parse is passed on untouched; the
// parser then only stops reading.
type uploadParser struct {
	pw     *io.PipeWriter
	done   chan struct{}
	mu     sync.Mutex
	broken bool
	files  []uploadedFile
}

// newUploadParser starts the parser of a body of that Content-Type, or returns nil
// when it is not multipart with a boundary.
func newUploadParser(contentType string) *uploadParser {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return nil
	}
	pr, pw := io.Pipe()
	u := &uploadParser{pw: pw, done: make(chan struct{})}
	go u.parse(multipart.NewReader(pr, params["boundary"]), pr)
	return u
}

// write hands the parser the next body bytes; it returns once they are parsed (or the
// parser gave up).
func (u *uploadParser) write(p []byte) {
	u.mu.Lock()
	broken := u.broken
	u.mu.Unlock()
	if broken {
		return
	}
	if _, err := u.pw.Write(p); err != nil {
		u.mu.Lock()
		u.broken = true
		u.mu.Unlock()
	}
}

// close ends the body and waits for the parser.
func (u *uploadParser) close() {
	_ = u.pw.Close()
	<-u.done
}

// result is what the parser saw (call after close).
func (u *uploadParser) result() []uploadedFile {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.files
}

func (u *uploadParser) parse(mr *multipart.Reader, pr *io.PipeReader) {
	defer close(u.done)
	// Whatever happens, the pipe is closed for writes: a writer never waits on a
	// parser that stopped.
	defer pr.CloseWithError(io.ErrClosedPipe)
	var meta *uploadedFile
	for {
		part, err := mr.NextPart()
		if err != nil {
			return
		}
		switch part.FormName() {
		case "metadata":
			b, err := io.ReadAll(io.LimitReader(part, 64<<10))
			if err != nil {
				return
			}
			var m struct {
				Path  string `json:"path"`
				Owner string `json:"owner"`
				Group string `json:"group"`
				Mode  *int   `json:"mode"`
			}
			if json.Unmarshal(b, &m) != nil {
				return
			}
			meta = &uploadedFile{path: m.Path, owner: m.Owner, group: m.Group}
			if m.Mode != nil {
				meta.mode = strconv.Itoa(*m.Mode)
			}
		case "file":
			if meta == nil {
				return
			}
			f := *meta
			meta = nil
			h := sha256.New()
			n, err := io.Copy(h, part)
			f.size = n
			if err == nil {
				f.complete = true
				f.sha256 = hex.EncodeToString(h.Sum(nil))
			}
			u.mu.Lock()
			if len(u.files) < maxUploadFiles {
				u.files = append(u.files, f)
			}
			u.mu.Unlock()
			if err != nil {
				return
			}
		}
		part.Close()
	}
}
