package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/airlockdev/airlock/opensandbox"
)

// claimConfirmInterval is how often confirmClaimAsync asks an execd that did not answer.
const claimConfirmInterval = 250 * time.Millisecond

// confirmClaimAsync settles a claim a leader found stored with record.Claiming (its
// claimer stopped between the claim's one write and its answer, or answered and never
// wrote again): it asks the sandbox's execd at addr whether the claim released it
// (GET opensandbox.ReleasePath, until ReadyTimeout). Released: the claim answered
// Running, so the mark is cleared and stored. Still held: the claim never answered
// (the client got an error or nothing), and its request's env and entrypoint were
// never stored, so the sandbox is removed. No answer within ReadyTimeout: Failed.
func (s *Server) confirmClaimAsync(id string, addr netip.Addr) {
	s.wg.Go(func() {
		deadline := time.Now().Add(s.cfg.ReadyTimeout)
		for {
			held, err := s.releaseState(id, addr)
			if err == nil {
				s.settleClaim(id, held)
				return
			}
			if time.Now().After(deadline) {
				s.log.Warn("a claimed warm pool member's execd never answered; marking it failed", "sandbox_id", id, "err", err)
				s.mu.Lock()
				if e, ok := s.sbx[id]; ok && e.rec.Claiming {
					e.rec.Claiming = false
					if err := s.setStatusLocked(e.rec, opensandbox.Failed, "claim_unconfirmed",
						"the warm pool claim was interrupted and execd did not answer: "+err.Error()); err != nil {
						s.log.Error("persisting sandbox status failed", "sandbox_id", id, "err", err)
					}
				}
				s.mu.Unlock()
				return
			}
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(claimConfirmInterval):
			}
		}
	})
}

// settleClaim clears a confirmed claim's mark, or removes a claim that never released.
func (s *Server) settleClaim(id string, held bool) {
	s.mu.Lock()
	e, ok := s.sbx[id]
	if !ok || !e.rec.Claiming {
		s.mu.Unlock()
		return
	}
	rec := e.rec
	if !held {
		rec.Claiming = false
		addEventLocked(rec, EventLifecycle, EventNormal, "ClaimConfirmed", "an interrupted leader's warm pool claim: execd was released, the sandbox runs")
		err := s.commitLocked(rec)
		s.mu.Unlock()
		if err != nil {
			s.log.Error("persisting a confirmed claim failed", "sandbox_id", id, "err", err)
		}
		return
	}
	delete(s.sbx, id)
	s.mu.Unlock()
	s.log.Warn("removing a warm pool member whose claim never released it (its create never answered)", "sandbox_id", id)
	s.dropMember(rec)
}

// releaseState asks sandbox id's execd at addr whether it is still held. An execd
// without a hold (404) was never held.
func (s *Server) releaseState(id string, addr netip.Addr) (held bool, err error) {
	if !addr.IsValid() {
		return false, errors.New("the sandbox has no address")
	}
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	url := "http://" + net.JoinHostPort(addr.String(), strconv.Itoa(s.cfg.ExecdPort)) + opensandbox.ReleasePath
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set(opensandbox.HeaderExecdAccessToken, s.cfg.ExecdKey.Derive(id))
	resp, err := s.ping.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusNotFound:
		return false, nil
	case http.StatusOK:
		var st opensandbox.ReleaseState
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			return false, fmt.Errorf("%s: %w", url, err)
		}
		return st.Held, nil
	}
	return false, fmt.Errorf("%s answered %s", url, resp.Status)
}
