package sdk_test

import (
	"context"
	"testing"
	"time"

	"github.com/airlockdev/airlock/internal/codetest"
	"github.com/airlockdev/airlock/internal/lctest"
	"github.com/airlockdev/airlock/internal/testenv"
	"github.com/airlockdev/airlock/sdk"
)

// sdkCodeClient is codetest.Client through the SDK's execd client.
type sdkCodeClient struct{ x *sdk.Execd }

func (c sdkCodeClient) CreateContext(ctx context.Context, language string) (string, error) {
	cc, err := c.x.CreateContext(ctx, language)
	if err != nil {
		return "", err
	}
	return cc.ID, nil
}

func (c sdkCodeClient) Run(ctx context.Context, id, code string, on func(codetest.Event)) error {
	_, err := c.x.RunCode(ctx, sdk.CodeContext{ID: id}, code, func(ev sdk.Event) error {
		e := codetest.Event{Type: ev.Type, Text: ev.Text, At: time.Now()}
		if ev.Error != nil {
			e.ErrName, e.Traceback = ev.Error.Name, ev.Error.Traceback
		}
		on(e)
		return nil
	})
	return err
}

func (c sdkCodeClient) Interrupt(ctx context.Context, id string) error {
	return c.x.InterruptCode(ctx, id)
}

// TestCodeInterpreterLanguages runs every language of the code-interpreter image through
// the SDK against a real server and sandbox (codetest.Check).
func TestCodeInterpreterLanguages(t *testing.T) {
	img := testenv.NeedCodeInterpreterImage(t)
	h := lctest.New(t, lctest.Options{APIKey: key})
	c := newClient(t, h, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	sb, err := c.Create(ctx, sdk.CreateRequest{Image: img, Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	x, err := c.Execd(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	cl := sdkCodeClient{x: x}
	for _, lc := range codetest.Cases {
		t.Run(lc.Language, func(t *testing.T) { codetest.Check(t, cl, lc) })
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Error(err)
	}
}
