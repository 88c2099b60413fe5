package execd

import (
	"bytes"
	"errors"
	"io"
	"mime/multipart"
	"path/filepath"
	"strings"
	"testing"
)

// The fuzz targets below cover the request parsers that take paths and multipart input.
// Their seed corpora are committed under testdata/fuzz/<target>/ and run with every
// `go test`; `go test -fuzz=FuzzReadUpload ./execd` explores further.

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"/workspace/a.txt", "a/../../b", "../../../etc/passwd", ".", "", "/", "//x//y/", "a\x00b", "~/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		out, err := CleanPath("/workspace", p)
		if p == "" || strings.IndexByte(p, 0) >= 0 {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("CleanPath(%q) = %q, %v; want ErrInvalid", p, out, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("CleanPath(%q): %v", p, err)
		}
		if !filepath.IsAbs(out) || filepath.Clean(out) != out || strings.Contains(out, "/../") || strings.HasSuffix(out, "/..") {
			t.Fatalf("CleanPath(%q) = %q: not a clean absolute path", p, out)
		}
		if !filepath.IsAbs(p) && !strings.Contains(p, "..") && !strings.HasPrefix(out, "/workspace") {
			t.Fatalf("relative %q left the workdir: %q", p, out)
		}
	})
}

func FuzzParseRange(f *testing.F) {
	for _, s := range []string{"bytes=0-0", "bytes=0-", "bytes=-5", "bytes=5-2", "bytes=1-2,3-4", "items=0-1", "bytes=99999999999999999999-", "bytes= 3 - 7 ", ""} {
		f.Add(s, int64(10))
	}
	f.Fuzz(func(t *testing.T, h string, size int64) {
		if size < 0 {
			size = -size
		}
		if size < 0 {
			return
		}
		r, ok, err := ParseRange(h, size)
		if err != nil {
			if ok || !(errors.Is(err, ErrInvalid) || errors.Is(err, ErrRange)) {
				t.Fatalf("ParseRange(%q, %d): ok=%v err=%v", h, size, ok, err)
			}
			return
		}
		if !ok {
			if h != "" {
				t.Fatalf("ParseRange(%q) neither a range nor an error", h)
			}
			return
		}
		if r.Start < 0 || r.Length < 1 || r.Start+r.Length > size {
			t.Fatalf("ParseRange(%q, %d) = %+v outside the file", h, size, r)
		}
	})
}

func FuzzParseMode(f *testing.F) {
	for _, m := range []int{755, 644, 0, 7777, 8, 789, -1, 10000, 4755} {
		f.Add(m)
	}
	f.Fuzz(func(t *testing.T, m int) {
		v, err := ParseMode(m)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ParseMode(%d): %v", m, err)
			}
			return
		}
		if v > 0o7777 || FormatMode(v) != m {
			t.Fatalf("ParseMode(%d) = %o, FormatMode back %d", m, v, FormatMode(v))
		}
	})
}

// uploadSeed is a well-formed SDK upload body with boundary "B".
const uploadSeed = "--B\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n" +
	`{"path":"/workspace/a.txt","mode":644}` + "\r\n--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\nContent-Type: application/octet-stream\r\n\r\nhello\r\n--B--\r\n"

func FuzzReadUpload(f *testing.F) {
	f.Add([]byte(uploadSeed))
	f.Add([]byte(strings.Replace(uploadSeed, `"mode":644`, `"mode":999`, 1)))
	f.Add([]byte(strings.Replace(uploadSeed, `name="metadata"`, `name="other"`, 1)))
	f.Add([]byte("--B--\r\n"))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, body []byte) {
		var saved []FileMetadata
		n, err := readUpload(multipart.NewReader(bytes.NewReader(body), "B"), func(m FileMetadata, r io.Reader) error {
			if m.Path == "" {
				t.Fatal("save called without a path")
			}
			if m.Mode != nil {
				if _, err := ParseMode(*m.Mode); err != nil {
					t.Fatalf("save called with bad mode %d", *m.Mode)
				}
			}
			io.Copy(io.Discard, r)
			saved = append(saved, m)
			return nil
		})
		if n != len(saved) {
			t.Fatalf("readUpload counted %d files, saved %d", n, len(saved))
		}
		if err == nil && n == 0 {
			t.Fatal("no error for an upload without files")
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("readUpload: %v is not ErrInvalid", err)
		}
	})
}

func TestReadUploadPairs(t *testing.T) {
	var got []string
	two := strings.Replace(uploadSeed, "--B--\r\n", "", 1) + strings.Replace(strings.Replace(uploadSeed, "a.txt", "b.txt", 2), "hello", "world", 1)
	n, err := readUpload(multipart.NewReader(strings.NewReader(two), "B"), func(m FileMetadata, r io.Reader) error {
		b, _ := io.ReadAll(r)
		got = append(got, m.Path+"="+string(b))
		return nil
	})
	if err != nil || n != 2 || strings.Join(got, ",") != "/workspace/a.txt=hello,/workspace/b.txt=world" {
		t.Fatalf("n=%d err=%v got %q", n, err, got)
	}
}
