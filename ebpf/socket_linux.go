package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	bpf "github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// The socket layer: cgroup/connect4|6 and cgroup/sendmsg4|6 programs on a sandbox's
// cgroup v2 directory refuse denied destinations with EPERM (see airlock.c). The
// links are pinned beside the TC links (links/<idx>/cgroup_*), and ifindex_by_cgroup
// maps the cgroup's id to the sandbox's config.

// sockProgs lists the socket programs and where each attaches: the sock_ops program
// (process attribution of TCP flows) only while attribution is on.
func (d *Datapath) sockProgs() []struct {
	name string
	prog *bpf.Program
	at   bpf.AttachType
} {
	progs := []struct {
		name string
		prog *bpf.Program
		at   bpf.AttachType
	}{
		{"cgroup_connect4", d.objs.AirlockConnect4, bpf.AttachCGroupInet4Connect},
		{"cgroup_connect6", d.objs.AirlockConnect6, bpf.AttachCGroupInet6Connect},
		{"cgroup_sendmsg4", d.objs.AirlockSendmsg4, bpf.AttachCGroupUDP4Sendmsg},
		{"cgroup_sendmsg6", d.objs.AirlockSendmsg6, bpf.AttachCGroupUDP6Sendmsg},
	}
	if !d.cfg.NoAttribution {
		progs = append(progs, struct {
			name string
			prog *bpf.Program
			at   bpf.AttachType
		}{"cgroup_sockops", d.objs.AirlockSockops, bpf.AttachCGroupSockOps})
	}
	return progs
}

// cgroupID returns the id of the cgroup v2 directory path (its inode number).
func cgroupID(path string) (uint64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.IsDir() {
		return 0, fmt.Errorf("%s is not a cgroup directory", path)
	}
	return st.Ino, nil
}

// hookCgroup attaches the socket programs to the sandbox's cgroup, pins the links and
// maps the cgroup to the sandbox. On error nothing of it is left.
func (d *Datapath) hookCgroup(s *sandbox, path string) (err error) {
	id, err := cgroupID(path)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	dir := d.linkDir(s)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var links []link.Link
	defer func() {
		if err != nil {
			for _, l := range links {
				l.Unpin()
				l.Close()
			}
			d.objs.IfindexByCgroup.Delete(id)
		}
	}()
	// The map entry first: a program that runs finds the config.
	if err := d.objs.IfindexByCgroup.Put(id, uint32(s.ifindex)); err != nil {
		return fmt.Errorf("map cgroup: %w", err)
	}
	for _, p := range d.sockProgs() {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: path, Attach: p.at, Program: p.prog})
		if err != nil {
			return fmt.Errorf("attach %s to %s: %w", p.name, path, err)
		}
		links = append(links, l)
		if err := l.Pin(filepath.Join(dir, p.name)); err != nil {
			return fmt.Errorf("pin link: %w", err)
		}
	}
	s.cgroupID, s.sockLinks = id, links
	return nil
}

// rehookCgroup points an adopted sandbox's pinned socket links at this process's
// programs. A sandbox without them keeps none (they are re-attached by the next
// Attach that names its cgroup).
func (d *Datapath) rehookCgroup(s *sandbox) error {
	dir := d.linkDir(s)
	var errs []error
	for _, p := range d.sockProgs() {
		l, err := link.LoadPinnedLink(filepath.Join(dir, p.name), nil)
		if err != nil {
			continue
		}
		if err := l.Update(p.prog); err != nil {
			errs = append(errs, fmt.Errorf("update link %s: %w", p.name, err))
		}
		s.sockLinks = append(s.sockLinks, l)
	}
	return errors.Join(errs...)
}

// unhookCgroup detaches the socket programs and removes the cgroup's map entry.
func (d *Datapath) unhookCgroup(s *sandbox) error {
	var names []string
	for _, p := range d.sockProgs() {
		names = append(names, p.name)
	}
	if d.cfg.NoAttribution {
		names = append(names, "cgroup_sockops") // pinned by a loader that attributed
	}
	errs := []error{releaseLinks(d.linkDir(s), names, s.sockLinks)}
	s.sockLinks = nil
	if s.cgroupID != 0 {
		var cur uint32
		if d.objs.IfindexByCgroup.Lookup(s.cgroupID, &cur) == nil && cur == uint32(s.ifindex) {
			if err := d.objs.IfindexByCgroup.Delete(s.cgroupID); err != nil && !errors.Is(err, bpf.ErrKeyNotExist) {
				errs = append(errs, err)
			}
		}
		s.cgroupID = 0
	}
	return errors.Join(errs...)
}
