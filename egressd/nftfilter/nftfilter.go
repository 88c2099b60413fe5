// Package nftfilter is Airlock's nftables egress datapath: the semantics of package
// egressd/datapath in an `inet airlock` table, one ingress base chain per sandbox hooked
// on its host-side veth, per-sandbox sets (source and resolver addresses, learned
// addresses with element timeouts, flows with idle timeouts) and named counters, all
// programmed over netlink with github.com/google/nftables (nft is never executed).
// It also owns the L7 redirect chain both backends use. README.md has the layout.
package nftfilter

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// TableName is the default name of the tables (inet and netdev) holding everything
// this package creates.
const TableName = "airlock"

// ValidTableName reports whether name can name the tables: 1 to 64 ASCII letters,
// digits, '_' or '-', starting with a letter (an nft identifier an operator can type).
func ValidTableName(name string) bool {
	if len(name) == 0 || len(name) > 64 {
		return false
	}
	for i, c := range name {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || !(c >= '0' && c <= '9' || c == '_' || c == '-')) {
			return false
		}
	}
	return true
}

// CheckTableName returns nil when name ("" meaning TableName) can name the tables,
// else an error wrapping datapath.ErrInvalidSpec that says what a name may hold.
func CheckTableName(name string) error {
	if ValidTableName(tableName(name)) {
		return nil
	}
	return fmt.Errorf("%w: nftables table name %q (1-64 letters, digits, '_' or '-', starting with a letter)", datapath.ErrInvalidSpec, name)
}

// tableName is name, or TableName when name is empty.
func tableName(name string) string {
	if name == "" {
		return TableName
	}
	return name
}

// Config configures the nftables datapath. The zero value is usable.
type Config struct {
	// NetNS is the path of the network namespace holding the veths; empty means the
	// caller's.
	NetNS string
	// Table names the inet and netdev tables this filter owns; default TableName. Two
	// egressd instances in one network namespace need different tables: each adopts
	// and detaches every sandbox chain in its own.
	Table string
	// FlowIdle is how long a flow lives without packets; default 1h.
	FlowIdle time.Duration
	// L7Mark and L7MarkMask are the mark given to TCP 80/443 of L7 sandboxes; default
	// L7MarkFor(Table) (the same as the eBPF backend; egressd/enforcer sets both).
	L7Mark, L7MarkMask uint32
	// LogGroup is the NFLOG group events are sent to; 0 disables events.
	LogGroup uint16
	// EventBuffer is the capacity of the Events channel; default 4096.
	EventBuffer int
	// Attribution, when set, names the process behind each event (Event.Process):
	// Attach watches the sandbox's cgroup (Spec.Cgroup) with it, Detach unwatches,
	// and each event gets the process recorded for its 5-tuple. The Filter owns it
	// from New on (Close closes it, also when New fails). A sandbox it cannot watch
	// is enforced all the same, its events without a process (logged). egressd/enforcer
	// sets it from the eBPF backend's recording-only socket programs.
	Attribution datapath.Attributor
	Logger      *slog.Logger
}

func (c *Config) defaults() {
	c.Table = tableName(c.Table)
	if c.FlowIdle <= 0 {
		c.FlowIdle = time.Hour
	}
	if c.L7Mark == 0 {
		c.L7Mark, c.L7MarkMask = L7MarkFor(c.Table)
	}
	if c.EventBuffer <= 0 {
		c.EventBuffer = 4096
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Filter is the nftables implementation of datapath.Datapath.
type Filter struct {
	cfg   Config
	log   *slog.Logger
	conn  *nftables.Conn
	nsFd  *os.File
	table *nftables.Table
	// ndTable holds each sandbox's pre-chain (netdev family, see hostChain).
	ndTable *nftables.Table

	// sbx is the attached set; its lock also serialises the writes on conn.
	sbx datapath.AttachedSet[*sandbox]

	events    chan datapath.Event
	lostLocal atomic.Uint64
	nflog     *nflogReader
}

type sandbox struct {
	id     string
	ifname string
	policy datapath.Policy
	known  bool
	// expiry mirrors the expiries of the learned grants written by this process, so
	// that a shorter ttl never shortens a live grant (re-adding an element resets its
	// timeout) and an address's live grants are counted.
	expiry map[netip.Addr]map[datapath.ProtoPorts]time.Time
}

// New connects to nftables (in cfg.NetNS), creates the airlock table if needed and
// adopts the sandbox chains already in it. Errors wrap datapath.ErrUnavailable when
// nftables cannot be used.
func New(cfg Config) (*Filter, error) {
	cfg.defaults()
	if err := CheckTableName(cfg.Table); err != nil {
		closeAttribution(cfg.Attribution)
		return nil, err
	}
	f := &Filter{cfg: cfg, log: cfg.Logger, events: make(chan datapath.Event, cfg.EventBuffer)}
	// A large socket send buffer lets UpdateMany send one transaction for many chains
	// (the default, about 200 KiB, holds the rules of a few sandboxes only).
	opts := []nftables.ConnOption{nftables.AsLasting(), nftables.WithSockOptions(bigSendBuffer)}
	if cfg.NetNS != "" {
		fd, err := os.Open(cfg.NetNS)
		if err != nil {
			closeAttribution(cfg.Attribution)
			return nil, fmt.Errorf("%w: netns: %v", datapath.ErrUnavailable, err)
		}
		f.nsFd = fd
		opts = append(opts, nftables.WithNetNSFd(int(fd.Fd())))
	}
	conn, err := nftables.New(opts...)
	if err != nil {
		f.closeFd()
		closeAttribution(cfg.Attribution)
		return nil, fmt.Errorf("%w: netlink: %v", datapath.ErrUnavailable, err)
	}
	f.conn = conn
	f.table = &nftables.Table{Name: cfg.Table, Family: nftables.TableFamilyINet}
	conn.AddTable(f.table)
	f.ndTable = &nftables.Table{Name: cfg.Table, Family: nftables.TableFamilyNetdev}
	conn.AddTable(f.ndTable)
	if err := conn.Flush(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: create table: %v", datapath.ErrUnavailable, err)
	}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("list chains: %w", err)
	}
	for _, c := range chains {
		if c.Table.Name != cfg.Table || !strings.HasPrefix(c.Name, "sbx_") {
			continue
		}
		id := strings.TrimPrefix(c.Name, "sbx_")
		s := &sandbox{id: id}
		// The hook device is not listed back: the first rule's user data carries it.
		if rules, err := conn.GetRules(f.table, c); err == nil && len(rules) > 0 {
			s.ifname = strings.TrimPrefix(string(rules[0].UserData), ifnameTag)
		}
		f.sbx.Add(id, s)
		f.log.Info("adopted sandbox", "sandbox_id", id, "ifname", s.ifname)
	}
	if cfg.LogGroup != 0 {
		r, err := newNflogReader(cfg.NetNS, cfg.LogGroup, f.deliver)
		if err != nil {
			f.log.Warn("nflog events unavailable", "err", err)
		} else {
			f.nflog = r
		}
	}
	if f.nflog == nil {
		close(f.events)
	}
	return f, nil
}

// Backend implements datapath.Datapath.
func (f *Filter) Backend() datapath.Backend { return datapath.BackendNFTables }

// Events implements datapath.Datapath. Without a LogGroup the channel is closed.
func (f *Filter) Events() <-chan datapath.Event { return f.events }

func (f *Filter) deliver(e datapath.Event) {
	if f.cfg.Attribution != nil && e.Sandbox != "" {
		e.Process = f.cfg.Attribution.Process(e)
	}
	select {
	case f.events <- e:
	default:
		f.lostLocal.Add(1)
	}
}

// Close implements datapath.Datapath; the table stays and keeps enforcing.
func (f *Filter) Close() error {
	f.sbx.Lock()
	open := f.sbx.Close()
	f.sbx.Unlock()
	if !open {
		return nil
	}
	var errs []error
	if f.nflog != nil {
		errs = append(errs, f.nflog.Close())
		close(f.events)
	}
	if f.conn != nil {
		errs = append(errs, f.conn.CloseLasting())
	}
	f.closeFd()
	if f.cfg.Attribution != nil {
		errs = append(errs, f.cfg.Attribution.Close())
	}
	return errors.Join(errs...)
}

// closeAttribution closes a, when set, for a New that fails.
func closeAttribution(a datapath.Attributor) {
	if a != nil {
		a.Close()
	}
}

func (f *Filter) closeFd() {
	if f.nsFd != nil {
		f.nsFd.Close()
	}
}

// Stats implements datapath.Datapath.
func (f *Filter) Stats() (datapath.Stats, error) {
	st := datapath.Stats{Backend: datapath.BackendNFTables, Sandboxes: map[string]datapath.SandboxStats{}, EventsLost: f.lostLocal.Load()}
	if f.nflog != nil {
		st.EventsLost += f.nflog.lost.Load()
	}
	f.sbx.Lock()
	defer f.sbx.Unlock()
	objs, err := f.conn.GetObjects(f.table)
	if err != nil {
		return st, fmt.Errorf("list counters: %w", err)
	}
	counters := map[string]uint64{}
	for _, o := range objs {
		if c, ok := o.(*nftables.CounterObj); ok {
			counters[c.Name] = c.Packets
		}
	}
	for id, s := range f.sbx.All() {
		ss := datapath.SandboxStats{Dropped: counters[dropCounter(id)], FlowsNew: counters[flowCounter(id)], Rules: len(s.policy.Rules)}
		for _, fm := range []fam{v4, v6} {
			if ls, err := f.conn.GetSetElements(f.set(learnSet(fm, id), addrType(fm))); err == nil {
				ss.Learned += len(ls)
			}
			if gs, _, err := f.grants(fm, id); err == nil {
				ss.Learned += len(gs)
			}
			flowType, _ := nftables.ConcatSetType(addrType(fm), nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeInetService)
			if fl, err := f.conn.GetSetElements(&nftables.Set{Table: f.table, Name: flowSet(fm, id), KeyType: flowType, Concatenation: true}); err == nil {
				ss.Flows += len(fl)
			}
		}
		st.Dropped += ss.Dropped
		st.FlowsNew += ss.FlowsNew
		st.Flows += ss.Flows
		st.Sandboxes[id] = ss
	}
	return st, nil
}

var _ datapath.Datapath = (*Filter)(nil)

// sendBufferBytes is the netlink socket's send buffer (SO_SNDBUFFORCE: egressd has
// CAP_NET_ADMIN); a failure leaves the default and UpdateMany falls back to one
// transaction per sandbox.
const sendBufferBytes = 64 << 20

func bigSendBuffer(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil
	}
	_ = rc.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sendBufferBytes)
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, sendBufferBytes/4)
	})
	return nil
}
