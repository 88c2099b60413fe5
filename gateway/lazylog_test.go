package gateway

import (
	"bytes"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// countingObject is a log object that counts how often it is encoded.
type countingObject struct{ n *int }

func (c countingObject) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	*c.n++
	enc.AddString("method", "GET")
	return enc.AddArray("headers", zapcore.ArrayMarshalerFunc(func(a zapcore.ArrayEncoder) error {
		a.AppendString("X-Request-Id")
		return nil
	}))
}

func testEncoderConfig() zapcore.EncoderConfig {
	cfg := zap.NewProductionEncoderConfig()
	cfg.TimeKey = "" // comparable output
	return cfg
}

// logAll runs the same logging on a logger whose core encodes with enc, at INFO.
func logAll(enc zapcore.Encoder, obj countingObject) string {
	var out bytes.Buffer
	l := zap.New(zapcore.NewCore(enc, zapcore.AddSync(&out), zapcore.InfoLevel))
	with := l.With(zap.String("upstream", "10.0.0.2:80"), zap.Duration("duration", 1500*time.Microsecond),
		zap.Object("request", obj), zap.Binary("raw", []byte{1, 2}), zap.Namespace("ns"))
	with.Debug("not written")
	nested := with.With(zap.Int("status", 502))
	with.Info("first", zap.Bool("flag", true))
	nested.Error("second")
	l.Info("plain", zap.Uint8("u", 7))
	return out.String()
}

// TestLazyEncoder: With's fields are not encoded until an entry is written, and every
// written entry is byte for byte what the wrapped encoder writes on its own.
func TestLazyEncoder(t *testing.T) {
	var eagerN, lazyN int
	eager := logAll(zapcore.NewJSONEncoder(testEncoderConfig()), countingObject{&eagerN})
	lazy := logAll(&LazyEncoder{wrapped: zapcore.NewJSONEncoder(testEncoderConfig())}, countingObject{&lazyN})
	if lazy != eager {
		t.Fatalf("the lazy encoder writes\n%s\nthe wrapped encoder writes\n%s", lazy, eager)
	}
	if eagerN != 1 { // once, at With
		t.Fatalf("the eager encoder encoded the object %d times, want 1 (the test's premise)", eagerN)
	}
	if lazyN != 2 { // once per written entry that holds it
		t.Fatalf("the lazy encoder encoded the object %d times, want 2 (the two written entries)", lazyN)
	}

	// Nothing written: nothing encoded.
	var n int
	l := zap.New(zapcore.NewCore(&LazyEncoder{wrapped: zapcore.NewJSONEncoder(testEncoderConfig())}, zapcore.AddSync(&bytes.Buffer{}), zapcore.InfoLevel))
	for range 3 {
		l.With(zap.Object("request", countingObject{&n})).Debug("upstream roundtrip")
	}
	if n != 0 {
		t.Fatalf("a logger's With fields were encoded %d times with no entry written", n)
	}
}
