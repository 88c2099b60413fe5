package nftfilter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"unsafe"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// L7ChainName is the nat chain that redirects marked TCP to the local L7 proxy.
const L7ChainName = "l7_redirect"

// L7Redirect describes the redirect both backends rely on: packets the sandbox chain
// (or eBPF program) marked with Mark under Mask are redirected, in prerouting, to
// Port on the address of the interface they arrived on (the bridge gateway). The proxy
// recovers the original destination with OriginalDst (conntrack, SO_ORIGINAL_DST).
type L7Redirect struct {
	NetNS      string // "" = the caller's namespace
	Port       uint16
	Mark, Mask uint32
}

// EnsureL7Redirect creates or replaces the l7_redirect chain in the airlock table, in
// one transaction.
func EnsureL7Redirect(r L7Redirect) error {
	if r.Port == 0 || r.Mark == 0 || r.Mark&^r.Mask != 0 {
		return fmt.Errorf("l7 redirect: port %d mark %#x/%#x: invalid", r.Port, r.Mark, r.Mask)
	}
	conn, closeFn, err := dial(r.NetNS)
	if err != nil {
		return err
	}
	defer closeFn()
	t := conn.AddTable(&nftables.Table{Name: TableName, Family: nftables.TableFamilyINet})
	c := conn.AddChain(&nftables.Chain{
		Name: L7ChainName, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest,
	})
	conn.FlushChain(c)
	conn.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, r.Mask), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: binary.NativeEndian.AppendUint32(nil, r.Mark)},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Immediate{Register: reg, Data: binary.BigEndian.AppendUint16(nil, r.Port)},
		&expr.Redir{RegisterProtoMin: reg},
	}})
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("l7 redirect chain: %w", err)
	}
	return nil
}

// RemoveL7Redirect deletes the l7_redirect chain if present.
func RemoveL7Redirect(netnsPath string) error {
	conn, closeFn, err := dial(netnsPath)
	if err != nil {
		return err
	}
	defer closeFn()
	t := &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
	if _, err := conn.ListChain(t, L7ChainName); err != nil {
		return nil
	}
	conn.DelChain(&nftables.Chain{Name: L7ChainName, Table: t})
	return conn.Flush()
}

// RemoveTable deletes the airlock tables (inet: every sandbox chain, set and the L7
// chain; netdev: the sandboxes' pre-chains). For operators and tests; egressd itself detaches sandbox by sandbox.
func RemoveTable(netnsPath string) error {
	conn, closeFn, err := dial(netnsPath)
	if err != nil {
		return err
	}
	defer closeFn()
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyNetdev} {
		if _, err := conn.ListTableOfFamily(TableName, fam); err == nil {
			conn.DelTable(&nftables.Table{Name: TableName, Family: fam})
		}
	}
	return conn.Flush()
}

// HasSandboxes reports whether the inet airlock table exists and holds a sandbox's
// chain (state a previous run left, which New would adopt).
func HasSandboxes(netnsPath string) (bool, error) {
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
		if c.Table.Name == TableName && strings.HasPrefix(c.Name, "sbx_") {
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
