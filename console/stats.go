package console

import (
	"cmp"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/opensandbox"
)

// egressSources are the audit sources whose records are egress decisions.
var egressSources = map[audit.Source]bool{audit.SourceDNS: true, audit.SourceBPF: true, audit.SourceL7: true, audit.SourceCredential: true}

// Bounds of GET /console/api/stats.
const (
	statsDefaultMinutes = 30
	statsMaxMinutes     = 24 * 60
	statsMaxSandboxes   = 12
	statsTopDenied      = 10
)

// statsSeries is one sandbox's egress decisions per minute.
type statsSeries struct {
	SandboxID string `json:"sandboxId"`
	Allowed   []int  `json:"allowed"`
	Denied    []int  `json:"denied"`
	Total     int    `json:"total"`
}

// destCount is one destination and how often it was denied.
type destCount struct {
	Destination string `json:"destination"`
	Count       int    `json:"count"`
}

// statsResponse is the body of GET /console/api/stats.
type statsResponse struct {
	// Start is the first minute (UTC, on the minute); bucket i covers
	// [Start+i min, Start+(i+1) min).
	Start   time.Time     `json:"start"`
	Minutes int           `json:"minutes"`
	Series  []statsSeries `json:"series"`
	// OtherSandboxes counts sandboxes beyond the busiest statsMaxSandboxes (left out).
	OtherSandboxes int         `json:"otherSandboxes"`
	TopDenied      []destCount `json:"topDenied"`
}

// handleStats answers GET /console/api/stats?minutes=&sandbox=: egress decisions
// (sources dns, bpf, l7, credential) per minute and sandbox over the last minutes
// (default 30, at most 1440), the busiest statsMaxSandboxes sandboxes, and the most
// denied destinations (dst_host, else dst_ip:dst_port). Aggregated from the audit log.
func (c *Console) handleStats(w http.ResponseWriter, r *http.Request) {
	if !c.needAudit(w) {
		return
	}
	minutes := statsDefaultMinutes
	if v := r.URL.Query().Get("minutes"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > statsMaxMinutes {
			writeError(w, http.StatusBadRequest, "INVALID_REQUEST", "minutes must be from 1 to 1440")
			return
		}
		minutes = n
	}
	end := c.cfg.Now().UTC().Truncate(time.Minute).Add(time.Minute)
	start := end.Add(-time.Duration(minutes) * time.Minute)
	resp, err := aggregate(c.cfg.AuditDir, audit.Filter{SandboxID: r.URL.Query().Get("sandbox"), Since: start, Until: end}, minutes)
	if err != nil {
		c.log.Error("aggregating the audit log failed", "err", err)
		writeError(w, http.StatusInternalServerError, "INTERNAL_ERROR", "reading the audit log failed")
		return
	}
	opensandbox.WriteJSON(w, http.StatusOK, resp)
}

// aggregate counts the egress decisions in f's time range (f.Since on a minute).
func aggregate(dir string, f audit.Filter, minutes int) (statsResponse, error) {
	series := map[string]*statsSeries{}
	denied := map[string]int{}
	err := audit.Scan(dir, f, func(rec audit.Record) error {
		if !egressSources[rec.Source] || rec.SandboxID == "" {
			return nil
		}
		i := int(rec.Time.Sub(f.Since) / time.Minute)
		if i < 0 || i >= minutes {
			return nil
		}
		s := series[rec.SandboxID]
		if s == nil {
			s = &statsSeries{SandboxID: rec.SandboxID, Allowed: make([]int, minutes), Denied: make([]int, minutes)}
			series[rec.SandboxID] = s
		}
		switch rec.Action {
		case "allow":
			s.Allowed[i]++
		case "deny":
			s.Denied[i]++
			dst := rec.DstHost
			if dst == "" && rec.DstIP != "" {
				dst = rec.DstIP
				if rec.DstPort != 0 {
					dst = net.JoinHostPort(rec.DstIP, strconv.Itoa(rec.DstPort))
				}
			}
			if dst != "" {
				denied[dst]++
			}
		default:
			return nil
		}
		s.Total++
		return nil
	})
	resp := statsResponse{Start: f.Since, Minutes: minutes, Series: []statsSeries{}, TopDenied: []destCount{}}
	for _, s := range series {
		resp.Series = append(resp.Series, *s)
	}
	slices.SortFunc(resp.Series, func(a, b statsSeries) int {
		return cmp.Or(cmp.Compare(b.Total, a.Total), cmp.Compare(a.SandboxID, b.SandboxID))
	})
	if len(resp.Series) > statsMaxSandboxes {
		resp.OtherSandboxes = len(resp.Series) - statsMaxSandboxes
		resp.Series = resp.Series[:statsMaxSandboxes]
	}
	for d, n := range denied {
		resp.TopDenied = append(resp.TopDenied, destCount{d, n})
	}
	slices.SortFunc(resp.TopDenied, func(a, b destCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Destination, b.Destination))
	})
	resp.TopDenied = resp.TopDenied[:min(len(resp.TopDenied), statsTopDenied)]
	return resp, err
}
