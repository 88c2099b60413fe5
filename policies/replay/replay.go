// Package replay evaluates a candidate policy against what a sandbox actually did: the
// DNS answers and flows of its audit log (package audit). It answers "what would this
// policy have denied that was allowed, and allowed that was denied", the safe way to roll
// out a tighter policy (`airlock policy test`).
package replay

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlockdev/airlock/audit"
	"github.com/airlockdev/airlock/policies"
)

// Finding is one destination whose verdict changes under the candidate, with how often
// the sandbox met it.
type Finding struct {
	// Kind is "dns" (a name asked), "flow" (a connection or datagram flow) or "http"
	// (a request to a host with HTTP rules: Target is "METHOD scheme://host:port/path").
	Kind string `json:"kind"`
	// Target is the name, or ip:port/proto for a flow (with the names that resolved to
	// the address, when the log has them, in Names).
	Target string   `json:"target"`
	Names  []string `json:"names,omitempty"`
	// Was is the recorded verdict (a report-mode would-deny counts as deny), Would the
	// candidate's; Rule and Reason are the candidate's deciding rule.
	Was    string    `json:"was"`
	Would  string    `json:"would"`
	Rule   string    `json:"rule"`
	Reason string    `json:"reason"`
	Count  int       `json:"count"`
	First  time.Time `json:"first"`
	Last   time.Time `json:"last"`
}

// Report is the result of a replay.
type Report struct {
	// Records is how many records were read, Evaluated how many were DNS answers,
	// flows or HTTP requests of the sandbox (others, such as gateway or policy records, are skipped).
	Records   int `json:"records"`
	Evaluated int `json:"evaluated"`
	// Unchanged counts evaluated records whose verdict the candidate keeps.
	Unchanged int `json:"unchanged"`
	// WouldDeny lists what was allowed and the candidate denies; WouldAllow what was
	// denied and the candidate allows. Both in order of first appearance.
	WouldDeny  []Finding `json:"wouldDeny"`
	WouldAllow []Finding `json:"wouldAllow"`
}

// Replay decides every DNS, flow and HTTP request record of recs with d. An HTTP
// request (an l7 record with extra.http_rule, written for hosts with HTTP rules) is
// decided as its host at its port, then against the host's HTTP rules by method and
// path (the query and headers are not in the record: rules that need them see none). Flows to an address are
// allowed when d allows the address itself, or a name that resolved to it in an earlier
// DNS record of recs at that port (as egressd learns names). Operator rules added at run
// time (the host's own address) are not in d, so traffic they denied may show as
// newly allowed.
func Replay(d *policies.Decider, recs []audit.Record) Report {
	rep := Report{Records: len(recs)}
	names := map[netip.Addr][]string{}
	index := map[string]int{} // key -> position in the findings
	var found []Finding
	for _, r := range recs {
		was := r.Action
		if r.WouldDeny || strings.EqualFold(strings.ReplaceAll(was, "-", "_"), "would_deny") {
			was = "deny" // report or audit mode: what enforcement would have done
		}
		var f Finding
		switch {
		case r.Source == audit.SourceDNS && r.DstHost != "":
			if was == "allow" {
				for _, a := range answers(r) {
					if !slices.Contains(names[a], r.DstHost) {
						names[a] = append(names[a], r.DstHost)
					}
				}
			}
			dec := d.DecideName(r.DstHost, 0, "")
			f = Finding{Kind: "dns", Target: policies.NormalizeName(r.DstHost), Would: verdict(dec), Rule: dec.Rule, Reason: dec.Reason}
		case r.Source == audit.SourceBPF && r.DstIP != "":
			ip, err := netip.ParseAddr(r.DstIP)
			if err != nil {
				continue
			}
			proto := policies.Protocol(r.Proto)
			port := uint16(r.DstPort)
			dec := d.DecideAddr(ip, port, proto)
			if verdict(dec) == "deny" {
				for _, n := range names[ip] {
					if nd := d.DecideName(n, port, proto); verdict(nd) == "allow" {
						if ld := d.DecideLearned(n, ip, port, proto); verdict(ld) == "allow" {
							dec = nd
							break
						}
					}
				}
			}
			f = Finding{Kind: "flow", Target: fmt.Sprintf("%s/%s", netip.AddrPortFrom(ip, port), r.Proto), Names: names[ip],
				Would: verdict(dec), Rule: dec.Rule, Reason: dec.Reason}
		case r.Source == audit.SourceL7 && r.DstHost != "" && r.Extra["http_rule"] == true:
			// One HTTP request to a host with HTTP rules: the host at its port, then
			// the request against the host's rules under the candidate.
			method, _ := r.Extra["method"].(string)
			path, _ := r.Extra["path"].(string)
			if method == "" || r.DstPort <= 0 || r.DstPort > 65535 {
				continue
			}
			dec := d.DecideName(r.DstHost, uint16(r.DstPort), policies.TCP)
			if dec.Allowed() && dec.HTTP != nil {
				dec = dec.HTTP.Decide(policies.HTTPRequest{Method: method, EscapedPath: (&url.URL{Path: path}).EscapedPath()})
			}
			f = Finding{Kind: "http", Target: fmt.Sprintf("%s %s://%s%s", strings.ToUpper(method), r.Proto,
				net.JoinHostPort(policies.NormalizeName(r.DstHost), strconv.Itoa(r.DstPort)), path),
				Would: verdict(dec), Rule: dec.Rule, Reason: dec.Reason}
		default:
			continue
		}
		rep.Evaluated++
		if was == f.Would || (was != "allow" && was != "deny") {
			rep.Unchanged++
			continue
		}
		f.Was = was
		key := f.Kind + "|" + f.Target + "|" + f.Would
		if i, ok := index[key]; ok {
			found[i].Count++
			found[i].Last = r.Time
			continue
		}
		f.Count, f.First, f.Last = 1, r.Time, r.Time
		index[key] = len(found)
		found = append(found, f)
	}
	for _, f := range found {
		if f.Would == "deny" {
			rep.WouldDeny = append(rep.WouldDeny, f)
		} else {
			rep.WouldAllow = append(rep.WouldAllow, f)
		}
	}
	return rep
}

// verdict is what enforcement would do: a report-mode would-deny is a deny.
func verdict(d policies.Decision) string {
	if d.Action == policies.Deny || d.WouldDeny {
		return "deny"
	}
	return "allow"
}

// answers reads the addresses of a DNS record (extra.answers).
func answers(r audit.Record) []netip.Addr {
	raw, _ := r.Extra["answers"].([]any)
	var out []netip.Addr
	for _, v := range raw {
		if s, ok := v.(string); ok {
			if a, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil {
				out = append(out, a)
			}
		}
	}
	if ss, ok := r.Extra["answers"].([]string); ok { // records built in memory
		for _, s := range ss {
			if a, err := netip.ParseAddr(s); err == nil {
				out = append(out, a)
			}
		}
	}
	return out
}
