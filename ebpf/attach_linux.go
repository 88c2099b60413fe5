package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	bpf "github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// tc filter identity used in clsact mode.
const (
	tcHandle   = 0xa1a1
	tcPriority = 0xa1
)

// netnsRef runs work inside a network namespace given by path ("" = the caller's).
type netnsRef struct{ path string }

// do runs fn on an OS thread that has entered the namespace. The thread is never
// returned to the scheduler (the goroutine exits locked), so no other goroutine
// inherits the namespace.
func (n netnsRef) do(fn func() error) error {
	if n.path == "" {
		return fn()
	}
	res := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		h, err := netns.GetFromPath(n.path)
		if err != nil {
			res <- fmt.Errorf("open netns %s: %w", n.path, err)
			return
		}
		defer h.Close()
		if err := unix.Setns(int(h), unix.CLONE_NEWNET); err != nil {
			res <- fmt.Errorf("enter netns %s: %w", n.path, err)
			return
		}
		res <- fn()
	}()
	return <-res
}

// handle returns a netlink handle in the namespace.
func (n netnsRef) handle() (*netlink.Handle, error) {
	if n.path == "" {
		return netlink.NewHandle()
	}
	h, err := netns.GetFromPath(n.path)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return netlink.NewHandleAt(h)
}

func (d *Datapath) linkDir(s *sandbox) string {
	return filepath.Join(d.cfg.PinRoot, "links", strconv.FormatUint(uint64(s.idx), 10))
}

// hook attaches both programs to the sandbox's veth (TCX links, pinned, when the
// config asks for them; clsact filters otherwise).
func (d *Datapath) hook(s *sandbox) error {
	if d.cfg.Attach == AttachTCX {
		if err := d.hookTCX(s); err != nil {
			return err
		}
		s.mode = AttachTCX
		return nil
	}
	if err := d.hookTC(s); err != nil {
		return err
	}
	s.mode = AttachTC
	return nil
}

func (d *Datapath) hookTCX(s *sandbox) error {
	dir := d.linkDir(s)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	progs := []struct {
		name string
		prog *bpf.Program
		at   bpf.AttachType
	}{
		{"ingress", d.objs.AirlockFromSbx, bpf.AttachTCXIngress},
		{"egress", d.objs.AirlockToSbx, bpf.AttachTCXEgress},
	}
	var links []link.Link
	fail := func(err error) error {
		for _, l := range links {
			l.Unpin()
			l.Close()
		}
		os.RemoveAll(dir)
		return err
	}
	for _, p := range progs {
		var l link.Link
		err := d.ns.do(func() error {
			var err error
			l, err = link.AttachTCX(link.TCXOptions{Interface: s.ifindex, Program: p.prog, Attach: p.at})
			return err
		})
		if err != nil {
			return fail(fmt.Errorf("attach tcx %s on ifindex %d: %w", p.name, s.ifindex, err))
		}
		links = append(links, l)
		if err := l.Pin(filepath.Join(dir, p.name)); err != nil {
			return fail(fmt.Errorf("pin link: %w", err))
		}
	}
	s.links = links
	return nil
}

func tcFilters(ifindex int, from, to *bpf.Program) []*netlink.BpfFilter {
	mk := func(parent uint32, p *bpf.Program, name string) *netlink.BpfFilter {
		f := &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{
				LinkIndex: ifindex,
				Parent:    parent,
				Handle:    tcHandle,
				Protocol:  unix.ETH_P_ALL,
				Priority:  tcPriority,
			},
			Name:         name,
			DirectAction: true,
			Fd:           -1,
		}
		if p != nil {
			f.Fd = p.FD()
		}
		return f
	}
	return []*netlink.BpfFilter{
		mk(netlink.HANDLE_MIN_INGRESS, from, "airlock_from_sbx"),
		mk(netlink.HANDLE_MIN_EGRESS, to, "airlock_to_sbx"),
	}
}

func (d *Datapath) hookTC(s *sandbox) error {
	h, err := d.ns.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: s.ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := h.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add clsact on ifindex %d: %w", s.ifindex, err)
	}
	for _, f := range tcFilters(s.ifindex, d.objs.AirlockFromSbx, d.objs.AirlockToSbx) {
		if err := h.FilterReplace(f); err != nil {
			d.unhookTC(s)
			return fmt.Errorf("add tc filter on ifindex %d: %w", s.ifindex, err)
		}
	}
	return nil
}

// rehook points an adopted sandbox's existing hooks at the programs of this process,
// in place. Missing hooks are attached anew.
func (d *Datapath) rehook(s *sandbox) error {
	if s.mode == AttachTC {
		return d.hookTC(s) // FilterReplace swaps the program atomically
	}
	dir := d.linkDir(s)
	progs := map[string]*bpf.Program{"ingress": d.objs.AirlockFromSbx, "egress": d.objs.AirlockToSbx}
	var links []link.Link
	for _, name := range []string{"ingress", "egress"} {
		l, err := link.LoadPinnedLink(filepath.Join(dir, name), nil)
		if err != nil {
			for _, l := range links {
				l.Close()
			}
			d.log.Warn("pinned link missing, attaching again", "sandbox_id", s.id, "link", name, "err", err)
			d.unhookTCX(s)
			return d.hook(s)
		}
		links = append(links, l)
		if err := l.Update(progs[name]); err != nil {
			for _, l := range links {
				l.Close()
			}
			return fmt.Errorf("update link %s: %w", name, err)
		}
	}
	s.links = links
	return nil
}

// unhook removes the sandbox's hooks whatever the mode.
func (d *Datapath) unhook(s *sandbox) error {
	if s.mode == AttachTC {
		return d.unhookTC(s)
	}
	return d.unhookTCX(s)
}

// unhookTCX releases the sandbox's TCX links (detach removes their directory, which
// also holds the socket links).
func (d *Datapath) unhookTCX(s *sandbox) error {
	err := releaseLinks(d.linkDir(s), []string{"ingress", "egress"}, s.links)
	s.links = nil
	return err
}

// releaseLinks unpins, detaches and closes links, or, when this process holds none (an
// adopted sandbox), the links pinned in dir under names. A link already gone with its
// interface or cgroup is not an error.
func releaseLinks(dir string, names []string, links []link.Link) error {
	if len(links) == 0 {
		for _, name := range names {
			if l, err := link.LoadPinnedLink(filepath.Join(dir, name), nil); err == nil {
				links = append(links, l)
			}
		}
	}
	var errs []error
	for _, l := range links {
		if err := l.Unpin(); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		if err := l.Detach(); err != nil && !errors.Is(err, bpf.ErrNotSupported) &&
			!errors.Is(err, unix.ENOLINK) && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("detach link: %w", err))
		}
		l.Close()
	}
	return errors.Join(errs...)
}

func (d *Datapath) unhookTC(s *sandbox) error {
	h, err := d.ns.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	var errs []error
	for _, f := range tcFilters(s.ifindex, nil, nil) {
		if err := h.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("delete tc filter: %w", err))
		}
	}
	// Remove the clsact qdisc when nothing else uses it.
	if l, err := h.LinkByIndex(s.ifindex); err == nil {
		in, _ := h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
		out, _ := h.FilterList(l, netlink.HANDLE_MIN_EGRESS)
		if len(in) == 0 && len(out) == 0 {
			q := &netlink.GenericQdisc{
				QdiscAttrs: netlink.QdiscAttrs{LinkIndex: s.ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
				QdiscType:  "clsact",
			}
			if err := h.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("delete clsact: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}
