package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"golang.org/x/sync/singleflight"

	"github.com/airlockdev/airlock/gateway/accesstoken"
	"github.com/airlockdev/airlock/opensandbox"
	"github.com/airlockdev/airlock/principal"
)

// PrincipalKeysConfig lets the gateway admit lifecycle's other API keys (principals,
// package principal) on token ports, besides the configured one (APIKeySHA256): a key
// it does not know is looked up at URL, lifecycle's GET /v1/keys/self, with the key as
// OPEN-SANDBOX-API-KEY, and the answer is kept for CacheTTL (default 900ms, so a
// revoked key stops working within a second). An admin or operator key is admitted on
// every sandbox, a user key on the sandboxes it created (another's answers 404, as
// lifecycle does), an auditor key on none (403).
type PrincipalKeysConfig struct {
	URL      string         `json:"url"`
	CacheTTL caddy.Duration `json:"cache_ttl,omitempty"`
}

// maxPrincipalKeys bounds the cache: an attacker cycling keys gets no memory from it.
const maxPrincipalKeys = 4096

// principalKeys is the lookup cache of PrincipalKeysConfig.
type principalKeys struct {
	url    string
	ttl    time.Duration
	client *http.Client
	group  singleflight.Group

	mu sync.Mutex
	m  map[accesstoken.Digest]keyAnswer
}

type keyAnswer struct {
	p     principal.Principal
	ok    bool // a key lifecycle knows
	until time.Time
}

func newPrincipalKeys(c *PrincipalKeysConfig) *principalKeys {
	ttl := time.Duration(c.CacheTTL)
	if ttl <= 0 {
		ttl = 900 * time.Millisecond
	}
	return &principalKeys{url: c.URL, ttl: ttl, client: &http.Client{Timeout: 5 * time.Second},
		m: map[accesstoken.Digest]keyAnswer{}}
}

// errKeyLookup is a lookup that could not be made (lifecycle unreachable): the request
// is refused, never admitted.
var errKeyLookup = errors.New("the API key could not be checked with lifecycle")

// lookup returns the principal of key; ok false when lifecycle does not know the key.
func (k *principalKeys) lookup(ctx context.Context, key string, now time.Time) (principal.Principal, bool, error) {
	d := accesstoken.Sum(key)
	k.mu.Lock()
	a, hit := k.m[d]
	k.mu.Unlock()
	if hit && now.Before(a.until) {
		return a.p, a.ok, nil
	}
	v, err, _ := k.group.Do(d.String(), func() (any, error) { return k.ask(ctx, key) })
	if err != nil {
		return principal.Principal{}, false, err
	}
	a = v.(keyAnswer)
	a.until = now.Add(k.ttl)
	k.mu.Lock()
	if len(k.m) >= maxPrincipalKeys {
		for kd, old := range k.m {
			if !now.Before(old.until) {
				delete(k.m, kd)
			}
		}
	}
	if len(k.m) < maxPrincipalKeys {
		k.m[d] = a
	}
	k.mu.Unlock()
	return a.p, a.ok, nil
}

func (k *principalKeys) ask(ctx context.Context, key string) (keyAnswer, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.url, nil)
	if err != nil {
		return keyAnswer{}, err
	}
	req.Header.Set(opensandbox.HeaderAPIKey, key)
	resp, err := k.client.Do(req)
	if err != nil {
		return keyAnswer{}, fmt.Errorf("%w: %v", errKeyLookup, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		var p principal.Principal
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&p); err != nil || !p.Role.Valid() {
			return keyAnswer{}, fmt.Errorf("%w: lifecycle's answer names no role", errKeyLookup)
		}
		return keyAnswer{p: p, ok: true}, nil
	case http.StatusUnauthorized, http.StatusForbidden:
		return keyAnswer{}, nil
	}
	return keyAnswer{}, fmt.Errorf("%w: lifecycle answered %d", errKeyLookup, resp.StatusCode)
}
