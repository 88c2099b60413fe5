package execd_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/airlockdev/airlock/execd"
	"github.com/airlockdev/airlock/execd/execdtest"
	"github.com/airlockdev/airlock/internal/codetest"
	"github.com/airlockdev/airlock/internal/testenv"
)

// httpCodeClient drives execd's /code API over HTTP (codetest.Client).
type httpCodeClient struct{ base string }

func (c httpCodeClient) post(ctx context.Context, path string, body any) (*http.Response, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err == nil && resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("POST %s: %s: %s", path, resp.Status, msg)
	}
	return resp, err
}

func (c httpCodeClient) CreateContext(ctx context.Context, language string) (string, error) {
	resp, err := c.post(ctx, "/code/context", map[string]string{"language": language})
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var cc execd.CodeContext
	if err := json.NewDecoder(resp.Body).Decode(&cc); err != nil {
		return "", err
	}
	return cc.ID, nil
}

func (c httpCodeClient) Run(ctx context.Context, id, code string, on func(codetest.Event)) error {
	resp, err := c.post(ctx, "/code", execd.RunCodeRequest{Code: code, Context: &execd.CodeContext{ID: id}})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var ev execd.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("event %q: %w", sc.Text(), err)
		}
		e := codetest.Event{Type: ev.Type, Text: ev.Text, At: time.Now()}
		if ev.Error != nil {
			e.ErrName, e.Traceback = ev.Error.Name, ev.Error.Traceback
		}
		on(e)
	}
	return sc.Err()
}

func (c httpCodeClient) Interrupt(ctx context.Context, id string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, c.base+"/code?id="+url.QueryEscape(id), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("interrupt: %s", resp.Status)
	}
	return nil
}

// TestCodeInterpreterLanguages runs every language of the code-interpreter image in a
// real sandbox: state across runs, errors, interrupts, streaming (codetest.Check).
func TestCodeInterpreterLanguages(t *testing.T) {
	img := testenv.NeedCodeInterpreterImage(t)
	sb := execdtest.Start(t, execdtest.Options{Image: img})
	cl := httpCodeClient{base: sb.URL}
	for _, c := range codetest.Cases {
		t.Run(c.Language, func(t *testing.T) { codetest.Check(t, cl, c) })
	}
}
