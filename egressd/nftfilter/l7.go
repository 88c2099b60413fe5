package nftfilter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"unsafe"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/airlockdev/airlock/egressd/datapath"
)

// L7ChainName is the nat chain that redirects marked TCP to the local L7 proxy.
const L7ChainName = "l7_redirect"

// L7MarkFor returns the L7 mark and mask of the tables named table: datapath.DefaultL7Mark
// and DefaultL7MarkMask for the default tables ("" or TableName), for any other name a
// mark of its own under the same mask (bits 16-31: FNV-1a of the name folded to 16 bits,
// never 0 nor the default's). Every l7_redirect chain of a host sees every marked
// packet, and the first one that matches NATs the connection: with one mark shared by
// all, the chain of another egressd in the host's namespace (a second installation,
// tests side by side, or the tables a killed egressd left) would send this egressd's
// sandboxes to its own proxy port. Two names collide with probability 1/65534.
func L7MarkFor(table string) (mark, mask uint32) {
	if table == "" || table == TableName {
		return datapath.DefaultL7Mark, datapath.DefaultL7MarkMask
	}
	h := fnv.New32a()
	h.Write([]byte(table))
	v := h.Sum32()
	v = (v>>16 ^ v) & 0xffff
	if v == 0 || v == datapath.DefaultL7Mark>>16 {
		v = 0x1a18
	}
	return v << 16, datapath.DefaultL7MarkMask
}

// L7Redirect describes the redirect both backends rely on: packets the sandbox chain
// (or eBPF program) marked with Mark under Mask are redirected, in prerouting, to
// Port on the address of the interface they arrived on (the bridge gateway), or, with
// Addr, IPv4 packets to Addr:Port (DNAT): on a Kubernetes node the proxy listens on
// the node-local resolver address, and the interface a pod's packet arrives on is its
// routed veth, whose address is not that one. The proxy recovers the original
// destination with OriginalDst (conntrack, SO_ORIGINAL_DST).
type L7Redirect struct {
	NetNS      string // "" = the caller's namespace
	Table      string // "" = TableName
	Port       uint16
	Mark, Mask uint32
	// Addr, when a valid IPv4 address, is where marked IPv4 TCP goes (DNAT); marked
	// IPv6 is still redirected to the incoming interface's address.
	Addr netip.Addr
}

// EnsureL7Redirect creates or replaces the l7_redirect chain in r's inet table, in
// one transaction.
func EnsureL7Redirect(r L7Redirect) error {
	r.Table = tableName(r.Table)
	if err := CheckTableName(r.Table); err != nil {
		return fmt.Errorf("l7 redirect: %w", err)
	}
	if r.Port == 0 || r.Mark == 0 || r.Mark&^r.Mask != 0 || (r.Addr.IsValid() && !r.Addr.Unmap().Is4()) {
		return fmt.Errorf("l7 redirect: address %s port %d mark %#x/%#x: invalid", r.Addr, r.Port, r.Mark, r.Mask)
	}
	conn, closeFn, err := dial(r.NetNS)
	if err != nil {
		return err
	}
	defer closeFn()
	t := conn.AddTable(&nftables.Table{Name: r.Table, Family: nftables.TableFamilyINet})
	c := conn.AddChain(&nftables.Chain{
		Name: L7ChainName, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest,
	})
	conn.FlushChain(c)
	marked := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, r.Mask), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: binary.NativeEndian.AppendUint32(nil, r.Mark)},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{unix.IPPROTO_TCP}},
	}
	if r.Addr.IsValid() {
		// IPv4 to Addr:Port; the first rule that NATs a connection ends the chain.
		conn.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: append(slices.Clone(marked),
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{unix.NFPROTO_IPV4}},
			&expr.Immediate{Register: reg, Data: r.Addr.Unmap().AsSlice()},
			&expr.Immediate{Register: reg2, Data: binary.BigEndian.AppendUint16(nil, r.Port)},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: reg, RegProtoMin: reg2, Specified: true},
		)})
	}
	conn.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: append(marked,
		&expr.Immediate{Register: reg, Data: binary.BigEndian.AppendUint16(nil, r.Port)},
		&expr.Redir{RegisterProtoMin: reg},
	)})
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("l7 redirect chain: %w", err)
	}
	return nil
}

// RemoveTable deletes the tables named table (TableName when empty) in the namespace
// at netnsPath ("" = the caller's): inet, with every sandbox chain, set and the L7
// chain, and netdev, with the sandboxes' pre-chains. It returns the families it
// removed ("inet", "netdev"); a missing table is not an error. For operators and
// tests; egressd itself detaches sandbox by sandbox.
func RemoveTable(netnsPath, table string) ([]string, error) {
	table = tableName(table)
	conn, closeFn, err := dial(netnsPath)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	var removed []string
	for _, f := range []struct {
		fam  nftables.TableFamily
		name string
	}{{nftables.TableFamilyINet, "inet"}, {nftables.TableFamilyNetdev, "netdev"}} {
		if _, err := conn.ListTableOfFamily(table, f.fam); err == nil {
			conn.DelTable(&nftables.Table{Name: table, Family: f.fam})
			removed = append(removed, f.name)
		}
	}
	if err := conn.Flush(); err != nil {
		return nil, fmt.Errorf("removing nftables tables %s: %w", table, err)
	}
	return removed, nil
}

// Tables returns the names of the inet and netdev tables in the namespace at netnsPath
// ("" = the caller's), each name once, whoever made them: for cleaners that pick the
// ones they own by name (enforcer.RemoveDead).
func Tables(netnsPath string) ([]string, error) {
	conn, closeFn, err := dial(netnsPath)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	var names []string
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyNetdev} {
		ts, err := conn.ListTablesOfFamily(fam)
		if err != nil {
			return nil, fmt.Errorf("listing nftables tables: %w", err)
		}
		for _, t := range ts {
			if !slices.Contains(names, t.Name) {
				names = append(names, t.Name)
			}
		}
	}
	return names, nil
}

// HasSandboxes reports whether the inet table named table (TableName when empty)
// exists and holds a sandbox's chain (state a previous run left, which New would
// adopt).
func HasSandboxes(netnsPath, table string) (bool, error) {
	table = tableName(table)
	conn, closeFn, err := dial(netnsPath)
	if err != nil {
		return false, err
	}
	defer closeFn()
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, err
	}
	for _, c := range chains {
		if c.Table.Name == table && strings.HasPrefix(c.Name, "sbx_") {
			return true, nil
		}
	}
	return false, nil
}

func dial(netnsPath string) (*nftables.Conn, func(), error) {
	if netnsPath == "" {
		c, err := nftables.New()
		return c, func() {}, err
	}
	f, err := os.Open(netnsPath)
	if err != nil {
		return nil, nil, err
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return c, func() { f.Close() }, nil
}

// OriginalDst returns the destination a redirected connection was sent to, from
// conntrack (SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST on the accepted socket).
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	local, _ := c.LocalAddr().(*net.TCPAddr)
	v6 := local != nil && local.IP.To4() == nil
	var out netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		if !v6 {
			var sa unix.RawSockaddrInet4
			l := uint32(unsafe.Sizeof(sa))
			serr = getsockopt(fd, unix.SOL_IP, 80 /* SO_ORIGINAL_DST */, unsafe.Pointer(&sa), &l)
			if serr == nil {
				out = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), ntohs(sa.Port))
			}
			return
		}
		var sa unix.RawSockaddrInet6
		l := uint32(unsafe.Sizeof(sa))
		serr = getsockopt(fd, unix.SOL_IPV6, 80 /* IP6T_SO_ORIGINAL_DST */, unsafe.Pointer(&sa), &l)
		if serr == nil {
			out = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), ntohs(sa.Port))
		}
	})
	if err != nil {
		return out, err
	}
	if serr != nil {
		return out, fmt.Errorf("original destination: %w", serr)
	}
	return out, nil
}

func getsockopt(fd uintptr, level, name int, v unsafe.Pointer, l *uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(name), uintptr(v), uintptr(unsafe.Pointer(l)), 0)
	if e != 0 {
		return errors.Join(syscall.Errno(e))
	}
	return nil
}

func ntohs(p uint16) uint16 { return p>>8 | p<<8 }
