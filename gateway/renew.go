package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlockdev/airlock/gateway/routetable"
	"github.com/airlockdev/airlock/lifecycle/watch"
)

// renewer sends renew-on-access intents (OpenSandbox OSEP-0009, extension key
// access.renew.extend.seconds) to lifecycle: POST <url with {id}> {"expiresAt": now+extend}
// with the configured credential headers. touch never blocks the request: intents are
// throttled per sandbox (at most one per interval) and queued; when the queue is full the
// intent is dropped and counted.
type renewer struct {
	url      string // contains "{id}"
	header   http.Header
	client   *http.Client
	interval time.Duration
	queue    chan renewIntent
	log      *slog.Logger
	counts   *prometheus.CounterVec // nil-safe through count
	wg       sync.WaitGroup
}

type renewIntent struct {
	id        string
	expiresAt time.Time
}

// renewWorkers is how many intents are sent in parallel.
const renewWorkers = 2

func newRenewer(cfg *RenewConfig, counts *prometheus.CounterVec, log *slog.Logger) *renewer {
	return &renewer{
		url:      cfg.URL,
		header:   cfg.header(),
		client:   &http.Client{Timeout: time.Duration(cfg.Timeout)},
		interval: time.Duration(cfg.Interval),
		queue:    make(chan renewIntent, 1024),
		log:      log,
		counts:   counts,
	}
}

// touch records an access to the sandbox of e at now and queues a renew intent when the
// sandbox opted in, its expiry would move later, and the throttle allows it.
func (rn *renewer) touch(e *routetable.Entry, sb *watch.Sandbox, now time.Time) {
	if rn == nil || sb.RenewOnAccess <= 0 || sb.ExpiresAt == nil {
		return
	}
	target := now.Add(time.Duration(sb.RenewOnAccess) * time.Second).Truncate(time.Second)
	if !target.After(*sb.ExpiresAt) {
		return
	}
	if !e.ClaimRenew(now, rn.interval) {
		return
	}
	select {
	case rn.queue <- renewIntent{id: sb.ID, expiresAt: target}:
	default:
		rn.count("dropped")
		rn.log.Warn("renew intent dropped, queue full", "sandbox_id", sb.ID)
	}
}

// run sends queued intents until ctx ends.
func (rn *renewer) run(ctx context.Context) {
	for range renewWorkers {
		rn.wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case in := <-rn.queue:
					if err := rn.send(ctx, in); err != nil {
						rn.count("failed")
						rn.log.Warn("renew intent failed", "sandbox_id", in.id, "err", err)
						continue
					}
					rn.count("sent")
				}
			}
		})
	}
}

func (rn *renewer) wait() { rn.wg.Wait() }

func (rn *renewer) send(ctx context.Context, in renewIntent) error {
	body, _ := json.Marshal(map[string]string{"expiresAt": in.expiresAt.UTC().Format(time.RFC3339)})
	url := strings.ReplaceAll(rn.url, "{id}", in.id)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	for k, v := range rn.header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := rn.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("lifecycle answered %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

func (rn *renewer) count(res string) {
	if rn.counts != nil {
		rn.counts.WithLabelValues(res).Inc()
	}
}
