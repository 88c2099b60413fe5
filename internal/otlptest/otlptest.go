// Package otlptest runs the OpenTelemetry Collector's own OTLP receiver
// (go.opentelemetry.io/collector/receiver/otlpreceiver, OTLP/HTTP only) in the test's
// process, feeding in-memory sinks, so tests check what a real collector receives.
package otlptest

import (
	"context"
	"net"
	"testing"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configgrpc"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
)

// Collector is a running OTLP/HTTP receiver. Endpoint is its base URL
// (http://127.0.0.1:port); the signals are at /v1/logs, /v1/metrics and /v1/traces.
type Collector struct {
	Endpoint string
	Logs     *consumertest.LogsSink
	Metrics  *consumertest.MetricsSink
	Traces   *consumertest.TracesSink
}

// Start starts a receiver on a free loopback port; it stops at the test's end.
func Start(t testing.TB) *Collector {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c := &Collector{Endpoint: "http://" + addr, Logs: new(consumertest.LogsSink),
		Metrics: new(consumertest.MetricsSink), Traces: new(consumertest.TracesSink)}
	f := otlpreceiver.NewFactory()
	cfg := f.CreateDefaultConfig().(*otlpreceiver.Config)
	cfg.Protocols.GRPC = configoptional.None[configgrpc.ServerConfig]()
	cfg.Protocols.HTTP.GetOrInsertDefault().ServerConfig.NetAddr.Endpoint = addr
	ctx := context.Background()
	set := receivertest.NewNopSettings(f.Type())
	// One receiver instance serves all three signals (the factory shares it by config).
	lr, err := f.CreateLogs(ctx, set, cfg, c.Logs)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := f.CreateMetrics(ctx, set, cfg, c.Metrics)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := f.CreateTraces(ctx, set, cfg, c.Traces)
	if err != nil {
		t.Fatal(err)
	}
	host := componenttest.NewNopHost()
	for _, comp := range []interface {
		Start(context.Context, component.Host) error
		Shutdown(context.Context) error
	}{lr, mr, tr} {
		if err := comp.Start(ctx, host); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { comp.Shutdown(context.Background()) })
	}
	return c
}
