package lifecycle

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"sync"
)

// ExtCount is the create extension that forks: {"snapshotId": "snap-…", "extensions":
// {"airlock.dev/count": "5"}} restores that many sandboxes from one snapshot in one call
// (a whole number from 1 to MaxFork; only with snapshotId). Each is a restore of its own
// (its own id, access token, expiry, vault copy) with the same request, its policy
// enforced before its entrypoint runs; the extension is not stored with them.
//
// The answer is 202 with the first sandbox as the body (CreateSandboxResponse, so a
// client that ignores the extension reads one sandbox) plus "items", every sandbox made,
// the first included, in order; Location names the first. A fork that fails part-way
// deletes the sandboxes it made and answers the error.
const ExtCount = "airlock.dev/count"

// MaxFork is the largest airlock.dev/count.
const MaxFork = 50

// ForkResponse is the body of a create with ExtCount: the first sandbox, and all.
type ForkResponse struct {
	Sandbox
	Items []Sandbox `json:"items"`
}

// forkCount reads ExtCount from req: 0 when absent; ErrInvalidRequest when malformed,
// out of range or without snapshotId.
func forkCount(req *CreateRequest) (int, error) {
	v, ok := req.Extensions[ExtCount]
	if !ok {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxFork {
		return 0, fmt.Errorf("%w: extensions[%q] must be a whole number from 1 to %d", ErrInvalidRequest, ExtCount, MaxFork)
	}
	if req.SnapshotID == "" {
		return 0, fmt.Errorf("%w: extensions[%q] forks a snapshot: it needs snapshotId", ErrInvalidRequest, ExtCount)
	}
	return n, nil
}

// Fork restores n sandboxes from req's snapshot, all at once (ExtCount); req's own
// ExtCount is dropped. On any error the sandboxes made are deleted.
func (s *Server) Fork(ctx context.Context, req *CreateRequest, n int) (ForkResponse, error) {
	one := *req
	one.Extensions = maps.Clone(req.Extensions)
	delete(one.Extensions, ExtCount)
	out := make([]Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := one
			r.Extensions = maps.Clone(one.Extensions)
			out[i], errs[i] = s.Create(ctx, &r)
		})
	}
	wg.Wait()
	var first error
	for _, err := range errs {
		if err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		for i, sb := range out {
			if errs[i] == nil && sb.ID != "" {
				if err := s.Delete(context.WithoutCancel(ctx), sb.ID, "fork_failed"); err != nil {
					s.log.Error("removing a sandbox of a failed fork", "sandbox_id", sb.ID, "err", err)
				}
			}
		}
		return ForkResponse{}, first
	}
	return ForkResponse{Sandbox: out[0], Items: out}, nil
}
