package execd_test

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"testing"

	"github.com/airlockdev/airlock/execd"
	"github.com/airlockdev/airlock/execd/execdtest"
)

// uploadBody builds the multipart body the SDK sends: a metadata part, then the file.
func uploadBody(t testing.TB, meta any, data []byte, fileFirst bool) (string, []byte) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	writeMeta := func() {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="metadata"; filename="metadata"`)
		h.Set("Content-Type", "application/json")
		p, _ := mw.CreatePart(h)
		j, _ := json.Marshal(meta)
		p.Write(j)
	}
	writeFile := func() {
		p, _ := mw.CreateFormFile("file", "blob")
		p.Write(data)
	}
	if fileFirst {
		writeFile()
		writeMeta()
	} else {
		writeMeta()
		writeFile()
	}
	mw.Close()
	return mw.FormDataContentType(), buf.Bytes()
}

func upload(t testing.TB, base string, meta execd.FileMetadata, data []byte) *http.Response {
	t.Helper()
	ct, body := uploadBody(t, meta, data, false)
	return do(t, http.MethodPost, base+"/files/upload", body, "Content-Type", ct)
}

func q(path string) string { return url.QueryEscape(path) }

func TestFilesInSandbox(t *testing.T) {
	sb := execdtest.Start(t, execdtest.Options{})
	base := sb.URL
	data := make([]byte, 300<<10)
	rand.Read(data)
	for i := range 256 {
		data[i] = byte(i) // every byte value
	}
	mode := 640
	const file = "/workspace/up/deep/data.bin"
	expect(t, upload(t, base, execd.FileMetadata{Path: file, Owner: "nobody", Group: "nogroup", Mode: &mode}, data), http.StatusOK)

	info := map[string]execd.FileInfo{}
	decodeInto(t, do(t, http.MethodGet, base+"/files/info?path="+q(file)+"&path="+q("up/deep/../deep"), nil), &info)
	fi := info[file]
	if fi.Size != int64(len(data)) || fi.Mode != 640 || fi.Owner != "nobody" || fi.Group != "nogroup" || fi.Type != "file" {
		t.Fatalf("info %+v", fi)
	}
	if d := info["/workspace/up/deep"]; d.Type != "directory" {
		t.Fatalf("relative, dotted path not cleaned into /workspace: %+v", info)
	}

	got := expect(t, do(t, http.MethodGet, base+"/files/download?path="+q(file), nil), http.StatusOK)
	if !bytes.Equal(got, data) {
		t.Fatalf("download differs from upload (%d vs %d bytes)", len(got), len(data))
	}
	resp := do(t, http.MethodGet, base+"/files/download?path="+q(file), nil, "Range", "bytes=100-299")
	part := expect(t, resp, http.StatusPartialContent)
	if !bytes.Equal(part, data[100:300]) || resp.Header.Get("Content-Range") != "bytes 100-299/307200" {
		t.Fatalf("range answer %d bytes, Content-Range %q", len(part), resp.Header.Get("Content-Range"))
	}
	resp = do(t, http.MethodGet, base+"/files/download?path="+q(file), nil, "Range", "bytes=-10")
	if part = expect(t, resp, http.StatusPartialContent); !bytes.Equal(part, data[len(data)-10:]) {
		t.Fatal("suffix range")
	}
	expectError(t, do(t, http.MethodGet, base+"/files/download?path="+q(file), nil, "Range", "bytes=999999-"), http.StatusRequestedRangeNotSatisfiable, "RANGE_NOT_SATISFIABLE")
	expectError(t, do(t, http.MethodGet, base+"/files/download?path=/nope", nil), http.StatusNotFound, "NOT_FOUND")

	// Text files: replace with counts, search by basename glob.
	const txt = "/workspace/up/conf.txt"
	expect(t, upload(t, base, execd.FileMetadata{Path: txt}, []byte("host=localhost\nurl=localhost:80\n")), http.StatusOK)
	var counts map[string]struct{ ReplacedCount int }
	decodeInto(t, do(t, http.MethodPost, base+"/files/replace?verbose=true", map[string]any{
		txt: map[string]string{"old": "localhost", "new": "0.0.0.0"}, file: map[string]string{"old": "no-such-text-in-random", "new": "x"},
	}), &counts)
	if counts[txt].ReplacedCount != 2 || counts[file].ReplacedCount != 0 {
		t.Fatalf("replace counts %+v", counts)
	}
	if b := expect(t, do(t, http.MethodGet, base+"/files/download?path="+q(txt), nil), http.StatusOK); string(b) != "host=0.0.0.0\nurl=0.0.0.0:80\n" {
		t.Fatalf("replaced content %q", b)
	}
	if b := expect(t, do(t, http.MethodPost, base+"/files/replace", map[string]any{txt: map[string]string{"old": "0.0.0.0", "new": "h"}}), http.StatusOK); len(b) != 0 {
		t.Fatalf("non-verbose replace answered %q", b)
	}
	expectError(t, do(t, http.MethodPost, base+"/files/replace", map[string]any{txt: map[string]string{"old": "", "new": "h"}}), http.StatusBadRequest, "INVALID_REQUEST")
	var found []execd.FileInfo
	decodeInto(t, do(t, http.MethodGet, base+"/files/search?path=/workspace&pattern="+q("*.txt"), nil), &found)
	if len(found) != 1 || found[0].Path != txt {
		t.Fatalf("search *.txt: %+v", found)
	}
	decodeInto(t, do(t, http.MethodGet, base+"/files/search?path=/workspace", nil), &found)
	if len(found) != 2 {
		t.Fatalf("search without pattern: %+v", found)
	}

	// Permissions by name, move, delete.
	m600 := 600
	expect(t, do(t, http.MethodPost, base+"/files/permissions", map[string]execd.Permission{txt: {Owner: "nobody", Group: "nogroup", Mode: &m600}}), http.StatusOK)
	decodeInto(t, do(t, http.MethodGet, base+"/files/info?path="+q(txt), nil), &info)
	if fi := info[txt]; fi.Mode != 600 || fi.Owner != "nobody" || fi.Group != "nogroup" {
		t.Fatalf("after chmod/chown %+v", fi)
	}
	bad := 789
	expectError(t, do(t, http.MethodPost, base+"/files/permissions", map[string]execd.Permission{txt: {Mode: &bad}}), http.StatusBadRequest, "INVALID_REQUEST")
	expectError(t, do(t, http.MethodPost, base+"/files/permissions", map[string]execd.Permission{txt: {Owner: "no-such-user", Mode: &m600}}), http.StatusBadRequest, "INVALID_REQUEST")
	const moved = "/workspace/moved.txt"
	expect(t, do(t, http.MethodPost, base+"/files/mv", []map[string]string{{"src": txt, "dest": moved}}), http.StatusOK)
	expectError(t, do(t, http.MethodGet, base+"/files/info?path="+q(txt), nil), http.StatusNotFound, "NOT_FOUND")
	expectError(t, do(t, http.MethodPost, base+"/files/mv", []map[string]string{{"src": moved, "dest": "/no/such/dir/x"}}), http.StatusNotFound, "NOT_FOUND")
	expect(t, do(t, http.MethodDelete, base+"/files?path="+q(moved), nil), http.StatusOK)
	expectError(t, do(t, http.MethodGet, base+"/files/info?path="+q(moved), nil), http.StatusNotFound, "NOT_FOUND")
	expectError(t, do(t, http.MethodDelete, base+"/files?path=/workspace/up", nil), http.StatusBadRequest, "INVALID_REQUEST")

	// Directories: create with mode, list in order with depth, delete recursively.
	m700 := 700
	expect(t, do(t, http.MethodPost, base+"/directories", map[string]execd.Permission{"/workspace/d/b": {Mode: &m700, Owner: "nobody"}, "/workspace/d/a": {}}), http.StatusOK)
	var list []execd.FileInfo
	decodeInto(t, do(t, http.MethodGet, base+"/directories/list?path=/workspace/d", nil), &list)
	if len(list) != 2 || list[0].Path != "/workspace/d/a" || list[1].Path != "/workspace/d/b" || list[1].Mode != 700 || list[1].Owner != "nobody" {
		t.Fatalf("list %+v", list)
	}
	decodeInto(t, do(t, http.MethodGet, base+"/directories/list?path=/workspace&depth=3", nil), &list)
	var paths []string
	for _, e := range list {
		paths = append(paths, e.Path)
	}
	want := []string{"/workspace/d", "/workspace/d/a", "/workspace/d/b", "/workspace/up", "/workspace/up/deep", "/workspace/up/deep/data.bin"}
	if !equal(paths, want) {
		t.Fatalf("depth-3 listing %q", paths)
	}
	expect(t, do(t, http.MethodDelete, base+"/directories?path=/workspace/d&path=/workspace/up", nil), http.StatusOK)
	decodeInto(t, do(t, http.MethodGet, base+"/directories/list?path=/workspace", nil), &list)
	if len(list) != 0 {
		t.Fatalf("after delete %+v", list)
	}

	// Malformed uploads change nothing.
	ct, body := uploadBody(t, execd.FileMetadata{Path: "/workspace/x"}, []byte("x"), true)
	expectError(t, do(t, http.MethodPost, base+"/files/upload", body, "Content-Type", ct), http.StatusBadRequest, "INVALID_REQUEST")
	expectError(t, do(t, http.MethodPost, base+"/files/upload", "not multipart"), http.StatusBadRequest, "INVALID_REQUEST")
	expectError(t, do(t, http.MethodGet, base+"/files/info?path=/workspace/x", nil), http.StatusNotFound, "NOT_FOUND")
}
