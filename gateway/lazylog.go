package gateway

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/buffer"
	"go.uber.org/zap/zapcore"
)

func init() { caddy.RegisterModule(LazyEncoder{}) }

// LazyEncoder is the Caddy log encoder "airlock_lazy": it wraps another encoder and
// defers the fields a logger is given with With until an entry is written.
//
// Caddy's reverse_proxy gives its logger the upstream, the round trip's duration and
// the whole request (headers included) with zap's Logger.With after every round trip,
// for a debug entry and the rare error entry. zap encodes With's fields at once, through
// the wrapped encoders (here the redacting "filter" encoder): about 7–13 µs of CPU per
// proxied request, for entries that are almost never written. With this encoder the
// fields are kept as given and encoded, through the same wrapped encoder and so the
// same redaction, only when an entry is written.
//
// What an entry shows of a field given by reference (the request) is its state when the
// entry is written, not when With was called; reverse_proxy writes its entries on the
// request's goroutine, while the request is in flight.
//
// JSON: {"format": "airlock_lazy", "wrap": {<encoder>}}; wrap defaults to "json".
type LazyEncoder struct {
	WrapRaw json.RawMessage `json:"wrap,omitempty" caddy:"namespace=caddy.logging.encoders inline_key=format"`

	wrapped zapcore.Encoder // with no deferred field
	fields  []zapcore.Field // deferred, in the order given
}

// CaddyModule returns the Caddy module information.
func (LazyEncoder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "caddy.logging.encoders.airlock_lazy", New: func() caddy.Module { return new(LazyEncoder) }}
}

// Provision loads the wrapped encoder.
func (e *LazyEncoder) Provision(ctx caddy.Context) error {
	raw := e.WrapRaw
	if raw == nil {
		raw = json.RawMessage(`{"format":"json"}`)
		e.WrapRaw = raw
	}
	mod, err := ctx.LoadModule(e, "WrapRaw")
	if err != nil {
		return fmt.Errorf("airlock_lazy log encoder: loading the wrapped encoder: %w", err)
	}
	enc, ok := mod.(zapcore.Encoder)
	if !ok {
		return fmt.Errorf("airlock_lazy log encoder: module %T is not an encoder", mod)
	}
	e.wrapped = enc
	return nil
}

// ConfigureDefaultFormat passes the writer on to the wrapped encoder (Caddy's filter
// encoder chooses its default format by it).
func (e *LazyEncoder) ConfigureDefaultFormat(wo caddy.WriterOpener) error {
	if cfd, ok := e.wrapped.(caddy.ConfiguresFormatterDefault); ok {
		return cfd.ConfigureDefaultFormat(wo)
	}
	return nil
}

// Clone shares the wrapped encoder (never written to) and the deferred fields (a
// clipped slice: the clone's appends copy it).
func (e *LazyEncoder) Clone() zapcore.Encoder {
	return &LazyEncoder{wrapped: e.wrapped, fields: slices.Clip(e.fields)}
}

// EncodeEntry encodes the deferred fields into a clone of the wrapped encoder, then the
// entry and its own fields.
func (e *LazyEncoder) EncodeEntry(ent zapcore.Entry, fields []zapcore.Field) (*buffer.Buffer, error) {
	if len(e.fields) == 0 {
		return e.wrapped.EncodeEntry(ent, fields)
	}
	enc := e.wrapped.Clone()
	for i := range e.fields {
		e.fields[i].AddTo(enc)
	}
	return enc.EncodeEntry(ent, fields)
}

func (e *LazyEncoder) add(f zapcore.Field) { e.fields = append(e.fields, f) }

// zapcore.ObjectEncoder: every value is kept as the field zap would make of it.

func (e *LazyEncoder) AddArray(k string, v zapcore.ArrayMarshaler) error {
	e.add(zap.Array(k, v))
	return nil
}

func (e *LazyEncoder) AddObject(k string, v zapcore.ObjectMarshaler) error {
	e.add(zap.Object(k, v))
	return nil
}

func (e *LazyEncoder) AddBinary(k string, v []byte) { e.add(zap.Binary(k, slices.Clone(v))) }
func (e *LazyEncoder) AddByteString(k string, v []byte) {
	e.add(zap.ByteString(k, slices.Clone(v)))
}
func (e *LazyEncoder) AddBool(k string, v bool)              { e.add(zap.Bool(k, v)) }
func (e *LazyEncoder) AddComplex128(k string, v complex128)  { e.add(zap.Complex128(k, v)) }
func (e *LazyEncoder) AddComplex64(k string, v complex64)    { e.add(zap.Complex64(k, v)) }
func (e *LazyEncoder) AddDuration(k string, v time.Duration) { e.add(zap.Duration(k, v)) }
func (e *LazyEncoder) AddFloat64(k string, v float64)        { e.add(zap.Float64(k, v)) }
func (e *LazyEncoder) AddFloat32(k string, v float32)        { e.add(zap.Float32(k, v)) }
func (e *LazyEncoder) AddInt(k string, v int)                { e.add(zap.Int(k, v)) }
func (e *LazyEncoder) AddInt64(k string, v int64)            { e.add(zap.Int64(k, v)) }
func (e *LazyEncoder) AddInt32(k string, v int32)            { e.add(zap.Int32(k, v)) }
func (e *LazyEncoder) AddInt16(k string, v int16)            { e.add(zap.Int16(k, v)) }
func (e *LazyEncoder) AddInt8(k string, v int8)              { e.add(zap.Int8(k, v)) }
func (e *LazyEncoder) AddString(k, v string)                 { e.add(zap.String(k, v)) }
func (e *LazyEncoder) AddTime(k string, v time.Time)         { e.add(zap.Time(k, v)) }
func (e *LazyEncoder) AddUint(k string, v uint)              { e.add(zap.Uint(k, v)) }
func (e *LazyEncoder) AddUint64(k string, v uint64)          { e.add(zap.Uint64(k, v)) }
func (e *LazyEncoder) AddUint32(k string, v uint32)          { e.add(zap.Uint32(k, v)) }
func (e *LazyEncoder) AddUint16(k string, v uint16)          { e.add(zap.Uint16(k, v)) }
func (e *LazyEncoder) AddUint8(k string, v uint8)            { e.add(zap.Uint8(k, v)) }
func (e *LazyEncoder) AddUintptr(k string, v uintptr)        { e.add(zap.Uintptr(k, v)) }
func (e *LazyEncoder) AddReflected(k string, v any) error    { e.add(zap.Reflect(k, v)); return nil }
func (e *LazyEncoder) OpenNamespace(k string)                { e.add(zap.Namespace(k)) }

// Interface guards.
var (
	_ zapcore.Encoder                  = (*LazyEncoder)(nil)
	_ caddy.Provisioner                = (*LazyEncoder)(nil)
	_ caddy.ConfiguresFormatterDefault = (*LazyEncoder)(nil)
)
