//go:build ignore

// Airlock egress filter: TC programs on the host side of a sandbox's veth, and socket
// programs on the sandbox's cgroup.
//
//   airlock_from_sbx  TCX ingress of the host veth = every packet the sandbox sends.
//                     Verdict per packet: pass, or drop with an event. The
//                     enforcement of record.
//   airlock_to_sbx    TCX egress of the host veth = every packet delivered to the
//                     sandbox. Never drops; records inbound TCP connections (SYN) so
//                     the sandbox's replies pass.
//   airlock_connect4/6, airlock_sendmsg4/6
//                     cgroup/connect and cgroup/sendmsg of the sandbox's cgroup: the
//                     same decision at connect() and unconnected sendmsg(), refusing a
//                     denied destination with EPERM at once (one event, no packet).
//
// Per-sandbox state lives in inner maps of array-of-maps indexed by the sandbox index
// (rules4_of, rules6_of, learned_of); the sandbox is found by the veth's ifindex
// (sbx_cfg). See README.md for the full contract.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

char __license[] SEC("license") = "Dual MIT/GPL";

#define MAX_SANDBOXES 4096
#define MAX_RULES 16
#define MAX_ADDRS 4
#define MAX_LEARNED 16384
#define MAX_GRANTS 16 // datapath.MaxLearnedGrants
#define MAX_PREFIXES 4096
#define MAX_CGROUP_LEVEL 8 // ancestors of a process's cgroup searched for a sandbox's

// sbx_cfg.flags
#define CFG_V6_BLOCK 1
#define CFG_DEFAULT_ALLOW 2
#define CFG_L7 4
#define CFG_REPORT 8
#define CFG_COUNT_FLOWS 16 // count allowed flows' packets and bytes (audit: all)

// flow_val.flags
#define FLOW_INBOUND 1
#define FLOW_REPORTED 2

// event.kind
#define EV_FLOW 1
#define EV_DROP 2
#define EV_WOULD_DROP 3

// event.reason
#define R_RULE_ALLOW 1
#define R_LEARNED 2
#define R_DEFAULT_ALLOW 3
#define R_L7 4
#define R_RULE_DENY 10
#define R_DEFAULT_DENY 11
#define R_DNS 12
#define R_DOT 13
#define R_V6_BLOCKED 14
#define R_SPOOFED 15
#define R_NO_CONFIG 16
#define R_MALFORMED 17
#define R_ETHERTYPE 18

// stats index
#define ST_PASS 0
#define ST_DROP 1
#define ST_FLOW_NEW 2
#define ST_EVENTS_LOST 3
#define ST_INBOUND 4
#define ST_MAX 8

#define ACT_ALLOW 1
#define ACT_DENY 2
#define ACT_DENY_ALWAYS 3 // a deny report mode does not relax (overlay, guard)
#define ACT_DENY_AUDIT 4  // a deny rule in audit mode: passes as a would-drop in any mode

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_ACK 0x10

#define IPPROTO_ICMPV6_ 58

// Set at load time from Go (rewritten .rodata).
volatile const __u64 tcp_idle_ns = 3600ULL * 1000000000ULL;
volatile const __u64 udp_idle_ns = 120ULL * 1000000000ULL;
volatile const __u64 other_idle_ns = 30ULL * 1000000000ULL;
volatile const __u64 flow_window_ns = 2000000000ULL;
volatile const __u32 l7_mark = 0x1a170000;
volatile const __u32 l7_mark_mask = 0xffff0000;
// Process attribution (Config.NoAttribution sets 0): the socket programs record which
// process opened a flow and the flow's first event carries it.
volatile const __u32 attribute_procs = 1;
// Recording only (ebpf.OpenAttribution, beside the nftables datapath, which enforces):
// the socket programs record which process opened a flow and decide nothing, every
// call goes on and no event is emitted.
volatile const __u32 record_only = 0;
// The calling task is read through its BTF pointer (bpf_get_current_task_btf): plain
// loads where bpf_probe_read_kernel is a helper call per field. The loader sets 0 on a
// kernel that does not give these program types the helper; the code it gates is
// then dead and not verified.
volatile const __u32 task_btf = 1;

struct sbx_cfg {
	__u32 idx;
	__u32 gen;
	__u32 flags;
	__u32 resolver4;
	__u8 resolver6[16];
	__u32 addr4[MAX_ADDRS];
	__u8 addr6[MAX_ADDRS][16];
};

struct sbx_meta {
	__u8 id[64];
	__u32 ifindex;
	__u32 gen;
	__u32 attach_mode;
	__u32 pad;
	__u64 cgroup_id; // 0: no socket programs
};

struct rule_ent {
	__u16 lo;
	__u16 hi;
	__u8 proto;
	__u8 action;
	__u16 id;
};

struct rule_val {
	__u32 n;
	__u32 pad;
	struct rule_ent e[MAX_RULES];
};

struct lpm4_key {
	__u32 prefixlen;
	__u32 addr;
};

struct lpm6_key {
	__u32 prefixlen;
	__u8 addr[16];
};

struct addr16 {
	__u8 a[16];
};

// A learned address's grants: each allows one protocol (0: any) and port range until
// its own expiry; an unused grant has expires_ns 0.
struct learned_grant {
	__u64 expires_ns;
	__u16 lo;
	__u16 hi;
	__u8 proto;
	__u8 pad[3];
};

struct learned_val {
	struct learned_grant g[MAX_GRANTS];
};

struct flow_key {
	__u32 idx;
	__u8 proto;
	__u8 family;
	__u16 lport;
	__u16 rport;
	__u16 pad;
	__u8 raddr[16];
};

// An allowed flow. With CFG_COUNT_FLOWS an outbound flow also counts what the sandbox
// sent: packets less than flow_window_ns apart are one flow record's (first_ns..last_ns);
// a packet after a longer gap starts the next record (an EV_FLOW event), so userspace
// writes one audit record per burst with the counts read from here.
struct flow_val {
	__u64 seen_ns; // idle tracking, refreshed at most once a second
	__u32 gen;
	__u32 flags;
	__u64 first_ns;
	__u64 last_ns;
	__u64 packets;
	__u64 bytes;
	__u16 rule;
	__u8 reason;
	__u8 pad[5];
};

// The process that opened a flow, read from the current task when it connected or sent
// (host pid namespace). start_ns is the thread group leader's start_boottime, which
// /proc/<tgid>/stat's starttime shows in clock ticks: it tells the process from a later
// one that reuses its pid. tgid 0: unknown.
struct proc_info {
	__u64 start_ns;
	__u32 tgid;
	__u32 tid;
	__u32 ppid;     // real parent's tgid
	__u32 pgid;     // process group, the process group of an execd command (leader's pid)
	__u32 ns_tgid;  // tgid and pgid in the task's own (the sandbox's) pid namespace
	__u32 ns_pgid;
	__u16 args_len; // bytes of args read
	__u8 args_cut;  // 1: the command line is longer than args
	__u8 pad[5];
	char comm[16];
	char exe[32];   // name of the executable (mm->exe_file's dentry)
	char args[128]; // the command line as the process holds it (NUL-separated)
};

// A flow as the sandbox's socket saw it (addresses IPv4-mapped for v4); lport 0 for a
// connected UDP socket whose port the kernel had not picked yet.
struct proc_key {
	__u8 proto;
	__u8 family;
	__u16 lport;
	__u16 rport;
	__u16 pad;
	__u8 laddr[16];
	__u8 raddr[16];
};

// Kernel types read with CO-RE (relocated against the running kernel's BTF).
struct upid {
	int nr;
} __attribute__((preserve_access_index));

struct pid {
	unsigned int level;
	struct upid numbers[1];
} __attribute__((preserve_access_index));

struct qstr {
	const unsigned char *name;
} __attribute__((preserve_access_index));

struct dentry {
	struct qstr d_name;
} __attribute__((preserve_access_index));

struct path {
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct file {
	struct path f_path;
} __attribute__((preserve_access_index));

struct mm_struct {
	unsigned long arg_start;
	unsigned long arg_end;
	struct file *exe_file;
} __attribute__((preserve_access_index));

struct signal_struct {
	struct pid *pids[4];
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct mm_struct *mm;
	struct pid *thread_pid;
	struct task_struct *real_parent;
	struct task_struct *group_leader;
	struct signal_struct *signal;
	__u64 start_boottime;
	char comm[16];
} __attribute__((preserve_access_index));

#define PIDTYPE_PGID_ 2

struct event {
	__u64 ts_ns;
	__u32 idx;
	__u32 gen;
	__u8 kind;
	__u8 reason;
	__u8 proto;
	__u8 family;
	__u16 sport;
	__u16 dport;
	__u16 rule;
	__u16 flags; // EVF_*
	__u32 len;   // bytes of the packet (0 for a socket refusal)
	__u32 pad;
	__u8 saddr[16];
	__u8 daddr[16];
	struct proc_info proc; // the opening process (tgid 0: unknown)
};

// event.flags
#define EVF_SOCKET 1 // refused at connect()/sendmsg() by a cgroup program: no packet left

// A denied flow's accounting (drop_seen): a packet of a flow last seen less than
// flow_window_ns ago only updates it; an older or absent entry starts a new flow, the
// only packet that emits an event. Userspace reads the counters when it writes the
// flow's audit record.
struct drop_val {
	__u64 first_ns;
	__u64 last_ns;
	__u64 packets;
	__u64 bytes;
};

struct sbx_counters {
	__u64 pass;
	__u64 drop;
	__u64 flows;
};

// Force BTF for types only userspace uses.
const struct event *unused_event __attribute__((unused));
const struct sbx_meta *unused_meta __attribute__((unused));
const struct rule_val *unused_rule_val __attribute__((unused));
const struct lpm4_key *unused_lpm4 __attribute__((unused));
const struct lpm6_key *unused_lpm6 __attribute__((unused));
const struct learned_val *unused_learned __attribute__((unused));
const struct addr16 *unused_addr16 __attribute__((unused));
const struct drop_val *unused_drop_val __attribute__((unused));
const struct proc_key *unused_proc_key __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SANDBOXES);
	__type(key, __u32); // host veth ifindex
	__type(value, struct sbx_cfg);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cfg_by_ifindex SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SANDBOXES);
	__type(key, __u32); // sandbox index
	__type(value, struct sbx_meta);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} meta_by_idx SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, MAX_SANDBOXES);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);
		__uint(max_entries, MAX_PREFIXES);
		__uint(map_flags, BPF_F_NO_PREALLOC);
		__uint(key_size, sizeof(struct lpm4_key));
		__uint(value_size, sizeof(struct rule_val));
	});
} rules4_of SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, MAX_SANDBOXES);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);
		__uint(max_entries, MAX_PREFIXES);
		__uint(map_flags, BPF_F_NO_PREALLOC);
		__uint(key_size, sizeof(struct lpm6_key));
		__uint(value_size, sizeof(struct rule_val));
	});
} rules6_of SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, MAX_SANDBOXES);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_HASH);
		__uint(max_entries, MAX_LEARNED);
		__uint(map_flags, BPF_F_NO_PREALLOC);
		__uint(key_size, sizeof(struct addr16)); // IPv4-mapped or IPv6 address
		__uint(value_size, sizeof(struct learned_val));
	});
} learned_of SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072);
	__type(key, struct flow_key);
	__type(value, struct flow_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct flow_key);
	__type(value, struct drop_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} drop_seen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SANDBOXES);
	__type(key, __u64);   // cgroup v2 id of the sandbox's cgroup
	__type(value, __u32); // host veth ifindex (key of cfg_by_ifindex)
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ifindex_by_cgroup SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	// An entry is needed from connect() to the flow's first event (and a counted
	// flow's next records): 16 384 × ~300 bytes. On this datapath a TCP socket's
	// entry goes when the socket closes (airlock_sockops); with record_only (the
	// nftables datapath reads entries from user space after the fact) and for UDP,
	// the LRU ages entries out.
	__uint(max_entries, 16384);
	__type(key, struct proc_key);
	__type(value, struct proc_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} proc_by_flow SEC(".maps");

// One proc_info per CPU to fill (too big for the program's stack next to the rest).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct proc_info);
} proc_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ST_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_SANDBOXES);
	__type(key, __u32);
	__type(value, struct sbx_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sbx_stats SEC(".maps");

// pkt is the parsed view of one packet; addresses are 16 bytes (IPv4-mapped for v4).
struct pkt {
	__u8 family; // 4 or 6
	__u8 proto;
	__u8 frag;      // non-first fragment: no L4 header
	__u8 tcp_flags;
	__u8 icmp_type;
	__u8 pad[3];
	__u16 sport; // host order
	__u16 dport;
	__u32 saddr4; // network order (v4 only)
	__u32 daddr4;
	__u8 saddr[16];
	__u8 daddr[16];
};

static __always_inline void count(__u32 i)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &i);
	if (v)
		*v += 1;
}

static __always_inline void map4(__u8 *dst, __u32 a)
{
	__builtin_memset(dst, 0, 10);
	dst[10] = 0xff;
	dst[11] = 0xff;
	__builtin_memcpy(dst + 12, &a, 4);
}

static __always_inline int addr6_eq(const __u8 *a, const __u8 *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;
	return x[0] == y[0] && x[1] == y[1];
}

static __always_inline int addr6_zero(const __u8 *a)
{
	const __u64 *x = (const __u64 *)a;
	return x[0] == 0 && x[1] == 0;
}

static __always_inline int load_l4(struct __sk_buff *skb, __u32 off, struct pkt *p)
{
	if (p->frag)
		return 0;
	if (p->proto == IPPROTO_TCP) {
		__u8 h[14];
		if (bpf_skb_load_bytes(skb, off, h, sizeof(h)) < 0)
			return -1;
		p->sport = (h[0] << 8) | h[1];
		p->dport = (h[2] << 8) | h[3];
		p->tcp_flags = h[13];
	} else if (p->proto == IPPROTO_UDP) {
		__u8 h[4];
		if (bpf_skb_load_bytes(skb, off, h, sizeof(h)) < 0)
			return -1;
		p->sport = (h[0] << 8) | h[1];
		p->dport = (h[2] << 8) | h[3];
	} else if (p->proto == IPPROTO_ICMP || p->proto == IPPROTO_ICMPV6_) {
		__u8 t;
		if (bpf_skb_load_bytes(skb, off, &t, 1) < 0)
			return -1;
		p->icmp_type = t;
	}
	return 0;
}

// parse fills p from the packet; returns 1 for a packet to verdict, 0 for ARP (pass),
// negative with a drop reason otherwise.
static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	__u16 proto = bpf_ntohs(skb->protocol);
	if (proto == ETH_P_ARP)
		return 0;
	if (proto == ETH_P_IP) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0 || ip.ihl < 5)
			return -R_MALFORMED;
		p->family = 4;
		p->proto = ip.protocol;
		p->saddr4 = ip.saddr;
		p->daddr4 = ip.daddr;
		map4(p->saddr, ip.saddr);
		map4(p->daddr, ip.daddr);
		p->frag = (bpf_ntohs(ip.frag_off) & 0x1fff) != 0;
		if (load_l4(skb, ETH_HLEN + ip.ihl * 4, p) < 0)
			return -R_MALFORMED;
		return 1;
	}
	if (proto == ETH_P_IPV6) {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0)
			return -R_MALFORMED;
		p->family = 6;
		__builtin_memcpy(p->saddr, &ip6.saddr, 16);
		__builtin_memcpy(p->daddr, &ip6.daddr, 16);
		__u8 next = ip6.nexthdr;
		__u32 off = ETH_HLEN + sizeof(ip6);
#pragma unroll
		for (int i = 0; i < 4; i++) {
			if (next == 0 || next == 43 || next == 60) { // hop-by-hop, routing, dest opts
				__u8 h[2];
				if (bpf_skb_load_bytes(skb, off, h, 2) < 0)
					return -R_MALFORMED;
				next = h[0];
				off += (h[1] + 1) * 8;
			} else if (next == 44) { // fragment
				__u8 h[4];
				if (bpf_skb_load_bytes(skb, off, h, 4) < 0)
					return -R_MALFORMED;
				next = h[0];
				if ((((h[2] << 8) | h[3]) & 0xfff8) != 0)
					p->frag = 1;
				off += 8;
			} else {
				break;
			}
		}
		p->proto = next;
		if (load_l4(skb, off, p) < 0)
			return -R_MALFORMED;
		return 1;
	}
	return -R_ETHERTYPE;
}

// ns_nr is a struct pid's number in its innermost namespace (numbers[level]).
static __always_inline __u32 ns_nr(struct pid *p)
{
	if (!p)
		return 0;
	unsigned int lvl = BPF_CORE_READ(p, level);
	if (lvl > 32)
		return 0;
	int nr = 0;
	void *at = (void *)p + bpf_core_field_offset(struct pid, numbers) +
		   lvl * bpf_core_type_size(struct upid) + bpf_core_field_offset(struct upid, nr);
	bpf_probe_read_kernel(&nr, sizeof(nr), at);
	return nr;
}

// fill_proc returns the current process (the caller of connect/sendmsg) read into
// this CPU's scratch entry, 0 if there is none.
static __always_inline struct proc_info *fill_proc(void)
{
	__u32 zero = 0;
	struct proc_info *pi = bpf_map_lookup_elem(&proc_scratch, &zero);
	if (!pi)
		return 0;
	struct mm_struct *mm;
	if (task_btf) {
		// Loads through a BTF pointer: the verifier makes them fault-safe (a bad
		// pointer reads 0), no helper call.
		struct task_struct *t = bpf_get_current_task_btf();
		struct task_struct *leader = t->group_leader;
		pi->tgid = t->tgid;
		pi->tid = t->pid;
		pi->ppid = t->real_parent->tgid;
		pi->start_ns = leader->start_boottime;
		pi->ns_tgid = ns_nr(leader->thread_pid);
		struct pid *pg = t->signal->pids[PIDTYPE_PGID_];
		pi->pgid = pg ? pg->numbers[0].nr : 0;
		pi->ns_pgid = ns_nr(pg);
		bpf_probe_read_kernel_str(&pi->comm, sizeof(pi->comm), t->comm);
		mm = t->mm;
	} else {
		struct task_struct *t = (struct task_struct *)bpf_get_current_task();
		struct task_struct *leader = BPF_CORE_READ(t, group_leader);
		pi->tgid = BPF_CORE_READ(t, tgid);
		pi->tid = BPF_CORE_READ(t, pid);
		pi->ppid = BPF_CORE_READ(t, real_parent, tgid);
		pi->start_ns = BPF_CORE_READ(leader, start_boottime);
		pi->ns_tgid = ns_nr(BPF_CORE_READ(leader, thread_pid));
		struct signal_struct *sig = BPF_CORE_READ(t, signal);
		struct pid *pg = 0;
		if (sig)
			bpf_core_read(&pg, sizeof(pg), &sig->pids[PIDTYPE_PGID_]);
		pi->pgid = pg ? BPF_CORE_READ(pg, numbers[0].nr) : 0;
		pi->ns_pgid = ns_nr(pg);
		BPF_CORE_READ_STR_INTO(&pi->comm, t, comm);
		mm = BPF_CORE_READ(t, mm);
	}
	pi->exe[0] = 0;
	pi->args_len = 0;
	pi->args_cut = 0;
	if (!mm)
		return pi;
	const unsigned char *name;
	unsigned long a0, a1;
	if (task_btf) {
		name = mm->exe_file->f_path.dentry->d_name.name;
		a0 = mm->arg_start;
		a1 = mm->arg_end;
	} else {
		name = BPF_CORE_READ(mm, exe_file, f_path.dentry, d_name.name);
		a0 = BPF_CORE_READ(mm, arg_start);
		a1 = BPF_CORE_READ(mm, arg_end);
	}
	if (name)
		bpf_probe_read_kernel_str(pi->exe, sizeof(pi->exe), name);
	if (a1 > a0) {
		unsigned long n = a1 - a0;
		if (n > sizeof(pi->args)) {
			n = sizeof(pi->args);
			pi->args_cut = 1;
		}
		if (n > 0 && bpf_probe_read_user(pi->args, n & 0xff, (void *)a0) == 0)
			pi->args_len = n;
	}
	return pi;
}

// lookup_proc finds the process that opened the flow of p (proc_by_flow), for the
// flow's first event; a connected UDP socket's entry has local port 0.
static __always_inline struct proc_info *lookup_proc(struct pkt *p)
{
	if (!attribute_procs || (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP))
		return 0;
	struct proc_key k = {.proto = p->proto, .family = p->family, .lport = p->sport, .rport = p->dport};
	__builtin_memcpy(k.laddr, p->saddr, 16);
	__builtin_memcpy(k.raddr, p->daddr, 16);
	struct proc_info *pi = bpf_map_lookup_elem(&proc_by_flow, &k);
	if (!pi && p->proto == IPPROTO_UDP) {
		k.lport = 0;
		pi = bpf_map_lookup_elem(&proc_by_flow, &k);
	}
	return pi;
}

static __always_inline void put_proc(struct event *e, struct proc_info *pi)
{
	if (pi)
		__builtin_memcpy(&e->proc, pi, sizeof(*pi));
	else
		__builtin_memset(&e->proc, 0, sizeof(e->proc));
}

// emit reports an event; pi is the process when the caller is the socket layer (the
// current task), otherwise the flow's entry in proc_by_flow is looked up.
static __always_inline void emit(struct sbx_cfg *cfg, struct pkt *p, __u8 kind, __u8 reason,
				 __u16 rule, __u16 flags, __u32 len, struct proc_info *pi)
{
	if (!pi)
		pi = lookup_proc(p);
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(ST_EVENTS_LOST);
		return;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->idx = cfg ? cfg->idx : 0xffffffff;
	e->gen = cfg ? cfg->gen : 0;
	e->kind = kind;
	e->reason = reason;
	e->proto = p->proto;
	e->family = p->family;
	e->sport = p->sport;
	e->dport = p->dport;
	e->rule = rule;
	e->flags = flags;
	e->len = len;
	e->pad = 0;
	__builtin_memcpy(e->saddr, p->saddr, 16);
	__builtin_memcpy(e->daddr, p->daddr, 16);
	put_proc(e, pi);
	bpf_ringbuf_submit(e, 0);
}

static __always_inline void fill_key(struct flow_key *k, __u32 idx, struct pkt *p)
{
	k->idx = idx;
	k->proto = p->proto;
	k->family = p->family;
	k->lport = p->sport;
	k->rport = p->dport;
	k->pad = 0;
	__builtin_memcpy(k->raddr, p->daddr, 16);
}

static __always_inline __u64 idle_for(__u8 proto)
{
	if (proto == IPPROTO_TCP)
		return tcp_idle_ns;
	if (proto == IPPROTO_UDP)
		return udp_idle_ns;
	return other_idle_ns;
}

static __always_inline void sbx_count(__u32 idx, int drop, int flow)
{
	struct sbx_counters *c = bpf_map_lookup_elem(&sbx_stats, &idx);
	if (!c)
		return;
	if (drop)
		c->drop++;
	else
		c->pass++;
	if (flow)
		c->flows++;
}

// account counts a denied packet (or socket refusal) into its flow and reports the
// first of a flow (see struct drop_val).
static __always_inline void account(struct sbx_cfg *cfg, struct pkt *p, __u8 reason, __u16 rule,
				    __u16 flags, __u32 len, struct proc_info *pi)
{
	count(ST_DROP);
	if (cfg)
		sbx_count(cfg->idx, 1, 0);
	struct flow_key k = {};
	fill_key(&k, cfg ? cfg->idx : 0xffffffff, p);
	__u64 now = bpf_ktime_get_ns();
	struct drop_val *dv = bpf_map_lookup_elem(&drop_seen, &k);
	if (dv && now - dv->last_ns < flow_window_ns) {
		dv->last_ns = now;
		__sync_fetch_and_add(&dv->packets, 1);
		__sync_fetch_and_add(&dv->bytes, len);
		return;
	}
	struct drop_val nv = {.first_ns = now, .last_ns = now, .packets = 1, .bytes = len};
	bpf_map_update_elem(&drop_seen, &k, &nv, BPF_ANY);
	emit(cfg, p, EV_DROP, reason, rule, flags, len, pi);
}

// drop counts and reports a dropped packet and returns TC_ACT_SHOT.
static __always_inline int drop(struct __sk_buff *skb, struct sbx_cfg *cfg, struct pkt *p, __u8 reason,
				__u16 rule)
{
	account(cfg, p, reason, rule, 0, skb->len, 0);
	return TC_ACT_SHOT;
}

// lookup_rules returns ACT_ALLOW/ACT_DENY/ACT_DENY_ALWAYS for the first matching static rule, 0 if none.
static __always_inline int lookup_rules(struct sbx_cfg *cfg, struct pkt *p, __u16 *rule)
{
	struct rule_val *rv = 0;
	if (p->family == 4) {
		void *inner = bpf_map_lookup_elem(&rules4_of, &cfg->idx);
		if (!inner)
			return 0;
		struct lpm4_key k = {.prefixlen = 32, .addr = p->daddr4};
		rv = bpf_map_lookup_elem(inner, &k);
	} else {
		void *inner = bpf_map_lookup_elem(&rules6_of, &cfg->idx);
		if (!inner)
			return 0;
		struct lpm6_key k = {.prefixlen = 128};
		__builtin_memcpy(k.addr, p->daddr, 16);
		rv = bpf_map_lookup_elem(inner, &k);
	}
	if (!rv)
		return 0;
	__u32 n = rv->n;
	for (int i = 0; i < MAX_RULES; i++) {
		if (i >= n)
			break;
		struct rule_ent *e = &rv->e[i];
		if (e->proto != 0 && e->proto != p->proto)
			continue;
		if (!p->frag && (p->dport < e->lo || p->dport > e->hi))
			continue;
		*rule = e->id;
		return e->action;
	}
	return 0;
}

static __always_inline int learned(struct sbx_cfg *cfg, struct pkt *p)
{
	void *inner = bpf_map_lookup_elem(&learned_of, &cfg->idx);
	if (!inner)
		return 0;
	struct addr16 key;
	__builtin_memcpy(key.a, p->daddr, 16);
	struct learned_val *v = bpf_map_lookup_elem(inner, &key);
	if (!v)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	for (int i = 0; i < MAX_GRANTS; i++) {
		struct learned_grant *g = &v->g[i];
		if (g->expires_ns <= now)
			continue;
		if (g->proto != 0 && g->proto != p->proto)
			continue;
		if (!p->frag && (p->dport < g->lo || p->dport > g->hi))
			continue;
		return 1;
	}
	return 0;
}

static __always_inline int src_ok(struct sbx_cfg *cfg, struct pkt *p)
{
#pragma unroll
	for (int i = 0; i < MAX_ADDRS; i++) {
		if (p->family == 4) {
			if (cfg->addr4[i] != 0 && cfg->addr4[i] == p->saddr4)
				return 1;
		} else if (!addr6_zero(cfg->addr6[i]) && addr6_eq(cfg->addr6[i], p->saddr)) {
			return 1;
		}
	}
	return 0;
}

static __always_inline int is_resolver(struct sbx_cfg *cfg, struct pkt *p)
{
	if (p->family == 4)
		return cfg->resolver4 != 0 && cfg->resolver4 == p->daddr4;
	return !addr6_zero(cfg->resolver6) && addr6_eq(cfg->resolver6, p->daddr);
}

// would_drop passes a packet the policy would drop, as a reported flow with a
// would-drop event (report mode, or a rule in audit mode).
static __always_inline int would_drop(struct __sk_buff *skb, struct sbx_cfg *cfg, struct pkt *p, __u8 reason,
				      __u16 rule)
{
	struct flow_key k = {};
	fill_key(&k, cfg->idx, p);
	struct flow_val v = {.seen_ns = bpf_ktime_get_ns(), .gen = cfg->gen, .flags = FLOW_REPORTED};
	bpf_map_update_elem(&flows, &k, &v, BPF_ANY);
	count(ST_PASS);
	sbx_count(cfg->idx, 0, 1);
	emit(cfg, p, EV_WOULD_DROP, reason, rule, 0, skb->len, 0);
	return TC_ACT_OK;
}

// deny applies report mode: a policy drop becomes a pass with a would-drop event.
static __always_inline int deny(struct __sk_buff *skb, struct sbx_cfg *cfg, struct pkt *p, __u8 reason,
				__u16 rule)
{
	if (!(cfg->flags & CFG_REPORT))
		return drop(skb, cfg, p, reason, rule);
	return would_drop(skb, cfg, p, reason, rule);
}

static __always_inline int allow_new(struct __sk_buff *skb, struct sbx_cfg *cfg, struct pkt *p, __u8 reason,
				     __u16 rule)
{
	struct flow_key k = {};
	fill_key(&k, cfg->idx, p);
	__u64 now = bpf_ktime_get_ns();
	struct flow_val v = {.seen_ns = now, .gen = cfg->gen, .first_ns = now, .last_ns = now,
			     .packets = 1, .bytes = skb->len, .rule = rule, .reason = reason};
	bpf_map_update_elem(&flows, &k, &v, BPF_ANY);
	count(ST_PASS);
	count(ST_FLOW_NEW);
	sbx_count(cfg->idx, 0, 1);
	emit(cfg, p, EV_FLOW, reason, rule, 0, skb->len, 0);
	return TC_ACT_OK;
}

// count_flow adds a packet to an allowed flow's record, or, when the flow was quiet for
// flow_window_ns, starts its next record and reports it (EV_FLOW, the event built from
// the flow key; the source address is the sandbox's first of the family, which the
// source check already holds the packet to). Not inlined, and with its own event code:
// inlined, it cost the established-flow fast path about 5 % of a TCP stream even for
// sandboxes that do not count.
static __noinline int count_flow(struct sbx_cfg *cfg, struct flow_key *k, struct flow_val *fv, __u64 now,
				 __u32 len)
{
	if (now - fv->last_ns < flow_window_ns) {
		fv->last_ns = now;
		__sync_fetch_and_add(&fv->packets, 1);
		__sync_fetch_and_add(&fv->bytes, len);
		return 0;
	}
	fv->first_ns = now;
	fv->last_ns = now;
	fv->packets = 1;
	fv->bytes = len;
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(ST_EVENTS_LOST);
		return 1;
	}
	e->ts_ns = now;
	e->idx = cfg->idx;
	e->gen = cfg->gen;
	e->kind = EV_FLOW;
	e->reason = fv->reason;
	e->proto = k->proto;
	e->family = k->family;
	e->sport = k->lport;
	e->dport = k->rport;
	e->rule = fv->rule;
	e->flags = 0;
	e->len = len;
	e->pad = 0;
	__builtin_memset(e->saddr, 0, 16);
	if (k->family == 4) {
		e->saddr[10] = 0xff;
		e->saddr[11] = 0xff;
		__builtin_memcpy(&e->saddr[12], &cfg->addr4[0], 4);
	} else {
		__builtin_memcpy(e->saddr, cfg->addr6[0], 16);
	}
	__builtin_memcpy(e->daddr, k->raddr, 16);
	struct proc_info *pi = 0;
	if (attribute_procs && (k->proto == IPPROTO_TCP || k->proto == IPPROTO_UDP)) {
		struct proc_key pk = {.proto = k->proto, .family = k->family, .lport = k->lport, .rport = k->rport};
		__builtin_memcpy(pk.laddr, e->saddr, 16);
		__builtin_memcpy(pk.raddr, k->raddr, 16);
		pi = bpf_map_lookup_elem(&proc_by_flow, &pk);
		if (!pi && k->proto == IPPROTO_UDP) {
			pk.lport = 0;
			pi = bpf_map_lookup_elem(&proc_by_flow, &pk);
		}
	}
	put_proc(e, pi);
	bpf_ringbuf_submit(e, 0);
	return 1;
}

static __always_inline int pass(struct sbx_cfg *cfg)
{
	count(ST_PASS);
	sbx_count(cfg->idx, 0, 0);
	return TC_ACT_OK;
}

SEC("tc")
int airlock_from_sbx(struct __sk_buff *skb)
{
	struct pkt p = {};
	int r = parse(skb, &p);
	if (r == 0)
		return TC_ACT_OK; // ARP

	__u32 ifindex = skb->ifindex;
	struct sbx_cfg *cfg = bpf_map_lookup_elem(&cfg_by_ifindex, &ifindex);
	if (!cfg)
		return drop(skb, 0, &p, R_NO_CONFIG, 0);
	if (r < 0)
		return drop(skb, cfg, &p, -r, 0);

	// Neighbour discovery (RS, RA, NS, NA, redirect) keeps the link working.
	if (p.family == 6 && p.proto == IPPROTO_ICMPV6_ && p.icmp_type >= 133 && p.icmp_type <= 137)
		return pass(cfg);
	if (!src_ok(cfg, &p))
		return drop(skb, cfg, &p, R_SPOOFED, 0);

	int l4 = p.proto == IPPROTO_TCP || p.proto == IPPROTO_UDP;
	if (l4 && !p.frag && p.dport == 53) {
		if (is_resolver(cfg, &p))
			return pass(cfg);
		return deny(skb, cfg, &p, R_DNS, 0);
	}
	if (l4 && !p.frag && p.dport == 853)
		return deny(skb, cfg, &p, R_DOT, 0);
	if (p.family == 6 && (cfg->flags & CFG_V6_BLOCK))
		return deny(skb, cfg, &p, R_V6_BLOCKED, 0);

	struct flow_key k = {};
	fill_key(&k, cfg->idx, &p);
	struct flow_val *fv = bpf_map_lookup_elem(&flows, &k);
	if (fv && fv->gen == cfg->gen) {
		__u64 now = bpf_ktime_get_ns();
		if (now - fv->seen_ns < idle_for(p.proto)) {
			if (now - fv->seen_ns > 1000000000ULL)
				fv->seen_ns = now;
			if ((cfg->flags & CFG_COUNT_FLOWS) && !(fv->flags & (FLOW_INBOUND | FLOW_REPORTED)))
				count_flow(cfg, &k, fv, now, skb->len);
			return pass(cfg);
		}
	}

	// Echo replies answer an inbound ping.
	if ((p.proto == IPPROTO_ICMP && p.icmp_type == 0) ||
	    (p.proto == IPPROTO_ICMPV6_ && p.icmp_type == 129))
		return pass(cfg);

	__u16 rule = 0;
	int act = lookup_rules(cfg, &p, &rule);
	if (act == ACT_ALLOW)
		return allow_new(skb, cfg, &p, R_RULE_ALLOW, rule);
	if (act == ACT_DENY)
		return deny(skb, cfg, &p, R_RULE_DENY, rule);
	if (act == ACT_DENY_ALWAYS)
		return drop(skb, cfg, &p, R_RULE_DENY, rule);
	if (act == ACT_DENY_AUDIT)
		return would_drop(skb, cfg, &p, R_RULE_DENY, rule);

	if ((cfg->flags & CFG_L7) && p.proto == IPPROTO_TCP && (p.dport == 80 || p.dport == 443)) {
		skb->mark = (skb->mark & ~l7_mark_mask) | l7_mark;
		return pass(cfg);
	}
	if (learned(cfg, &p))
		return allow_new(skb, cfg, &p, R_LEARNED, 0);
	if (cfg->flags & CFG_DEFAULT_ALLOW)
		return allow_new(skb, cfg, &p, R_DEFAULT_ALLOW, 0);
	return deny(skb, cfg, &p, R_DEFAULT_DENY, 0);
}

SEC("tc")
int airlock_to_sbx(struct __sk_buff *skb)
{
	// Fast path: only a TCP SYN without ACK (an inbound connection) needs work; read
	// just the protocol and flags before any map lookup.
	__u16 eth = bpf_ntohs(skb->protocol);
	__u8 b[2];
	__u32 l4off;
	if (eth == ETH_P_IP) {
		if (bpf_skb_load_bytes(skb, ETH_HLEN, b, 1) < 0)
			return TC_ACT_OK;
		l4off = ETH_HLEN + (b[0] & 0x0f) * 4;
		if (bpf_skb_load_bytes(skb, ETH_HLEN + 9, b, 1) < 0)
			return TC_ACT_OK;
	} else if (eth == ETH_P_IPV6) {
		l4off = ETH_HLEN + sizeof(struct ipv6hdr);
		if (bpf_skb_load_bytes(skb, ETH_HLEN + 6, b, 1) < 0)
			return TC_ACT_OK;
	} else {
		return TC_ACT_OK;
	}
	if (b[0] != IPPROTO_TCP || bpf_skb_load_bytes(skb, l4off + 13, b + 1, 1) < 0)
		return TC_ACT_OK;
	if ((b[1] & (TCP_SYN | TCP_ACK)) != TCP_SYN)
		return TC_ACT_OK;

	__u32 ifindex = skb->ifindex;
	struct sbx_cfg *cfg = bpf_map_lookup_elem(&cfg_by_ifindex, &ifindex);
	if (!cfg)
		return TC_ACT_OK;
	struct pkt p = {};
	if (parse(skb, &p) != 1 || p.proto != IPPROTO_TCP || p.frag)
		return TC_ACT_OK;
	if ((p.tcp_flags & (TCP_SYN | TCP_ACK)) != TCP_SYN)
		return TC_ACT_OK;
	// From the sandbox's side: local port = destination here, remote = source.
	struct flow_key k = {
		.idx = cfg->idx,
		.proto = IPPROTO_TCP,
		.family = p.family,
		.lport = p.dport,
		.rport = p.sport,
	};
	__builtin_memcpy(k.raddr, p.saddr, 16);
	struct flow_val v = {.seen_ns = bpf_ktime_get_ns(), .gen = cfg->gen, .flags = FLOW_INBOUND};
	bpf_map_update_elem(&flows, &k, &v, BPF_ANY);
	count(ST_INBOUND);
	return TC_ACT_OK;
}

// ---- socket layer: cgroup/connect4|6 and cgroup/sendmsg4|6 ----
//
// The same decision as airlock_from_sbx for a new flow, taken when a process of the
// sandbox connects (TCP, connected UDP) or sends an unconnected datagram: a denied
// destination gets EPERM at once instead of a silent drop the caller waits out. The
// TC program stays the enforcement of record (it sees every packet, raw sockets and
// ICMP included); this layer only refuses earlier. Return 1 lets the call go on, 0
// makes it fail with EPERM.

static __always_inline int sock_refuse(struct sbx_cfg *cfg, struct pkt *p, __u8 reason, __u16 rule)
{
	static const struct proc_info none = {};
	struct proc_info *pi = attribute_procs ? fill_proc() : 0;
	account(cfg, p, reason, rule, EVF_SOCKET, 0, pi ? pi : (struct proc_info *)&none);
	return 0;
}

// remember_udp records the process sending a UDP datagram (or connecting a UDP
// socket: local port 0 until the kernel picks one) for the flow's first event. An
// entry that already names this thread is left alone: one lookup per datagram.
static __always_inline void remember_udp(struct bpf_sock_addr *ctx, struct pkt *p)
{
	struct proc_key k = {.proto = IPPROTO_UDP, .family = p->family, .rport = p->dport};
	struct bpf_sock *sk = ctx->sk;
	if (sk)
		k.lport = sk->src_port;
	__builtin_memcpy(k.laddr, p->saddr, 16);
	__builtin_memcpy(k.raddr, p->daddr, 16);
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct proc_info *old = bpf_map_lookup_elem(&proc_by_flow, &k);
	if (old && old->tid == tid)
		return;
	struct proc_info *pi = fill_proc();
	if (pi)
		bpf_map_update_elem(&proc_by_flow, &k, pi, BPF_ANY);
}

// sock_deny applies report mode like deny: the TC program reports the would-drop.
static __always_inline int sock_deny(struct sbx_cfg *cfg, struct pkt *p, __u8 reason, __u16 rule)
{
	if (cfg->flags & CFG_REPORT)
		return 1;
	return sock_refuse(cfg, p, reason, rule);
}

// sock_local reports destinations that never reach the veth: loopback, the unspecified
// address (the local host) and the sandbox's own addresses.
static __always_inline int sock_local(struct sbx_cfg *cfg, struct pkt *p)
{
	if (p->family == 4) {
		__u32 a = bpf_ntohl(p->daddr4);
		if ((a >> 24) == 127 || a == 0)
			return 1;
	} else {
		const __u64 *x = (const __u64 *)p->daddr;
		if (x[0] == 0 && (x[1] == 0 || x[1] == bpf_cpu_to_be64(1)))
			return 1; // :: and ::1
	}
#pragma unroll
	for (int i = 0; i < MAX_ADDRS; i++) {
		if (p->family == 4) {
			if (cfg->addr4[i] != 0 && cfg->addr4[i] == p->daddr4)
				return 1;
		} else if (!addr6_zero(cfg->addr6[i]) && addr6_eq(cfg->addr6[i], p->daddr)) {
			return 1;
		}
	}
	return 0;
}

static __always_inline int sock_verdict(struct bpf_sock_addr *ctx, int v6)
{
	__u64 cg = bpf_get_current_cgroup_id();
	__u32 *ifindex = bpf_map_lookup_elem(&ifindex_by_cgroup, &cg);
	// A process in a sub-cgroup of the sandbox's: a pod's containers live in
	// kubepods/<qos>/pod<uid>/<container>, below the pod's cgroup, which egressd maps.
	// Its own cgroup first, then its ancestors from the top; past its own level, 0.
#pragma unroll
	for (int level = 1; level <= MAX_CGROUP_LEVEL && !ifindex; level++) {
		cg = bpf_get_current_ancestor_cgroup_id(level);
		if (cg == 0)
			break;
		ifindex = bpf_map_lookup_elem(&ifindex_by_cgroup, &cg);
	}
	if (!ifindex)
		return 1; // an unknown cgroup: the TC program decides
	struct sbx_cfg *cfg = bpf_map_lookup_elem(&cfg_by_ifindex, ifindex);
	if (!cfg)
		return 1;

	struct pkt p = {};
	__u32 proto = ctx->protocol;
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 1;
	p.proto = proto;
	p.dport = bpf_ntohs((__u16)ctx->user_port);
	if (!v6) {
		p.family = 4;
		p.daddr4 = ctx->user_ip4;
	} else {
		__u32 w0 = ctx->user_ip6[0], w1 = ctx->user_ip6[1], w2 = ctx->user_ip6[2], w3 = ctx->user_ip6[3];
		if (w0 == 0 && w1 == 0 && w2 == bpf_htonl(0xffff)) {
			p.family = 4; // an IPv4-mapped address leaves as IPv4
			p.daddr4 = w3;
		} else {
			p.family = 6;
			__u32 *d = (__u32 *)p.daddr;
			d[0] = w0;
			d[1] = w1;
			d[2] = w2;
			d[3] = w3;
		}
	}
	if (p.family == 4) {
		map4(p.daddr, p.daddr4);
		p.saddr4 = cfg->addr4[0];
		map4(p.saddr, p.saddr4);
	} else {
		__builtin_memcpy(p.saddr, cfg->addr6[0], 16);
	}
	if (sock_local(cfg, &p))
		return 1;
	if (attribute_procs && p.proto == IPPROTO_UDP && p.dport != 53)
		remember_udp(ctx, &p);
	if (record_only)
		return 1;

	if (p.dport == 53) {
		if (is_resolver(cfg, &p))
			return 1;
		return sock_deny(cfg, &p, R_DNS, 0);
	}
	if (p.dport == 853)
		return sock_deny(cfg, &p, R_DOT, 0);
	if (p.family == 6 && (cfg->flags & CFG_V6_BLOCK))
		return sock_deny(cfg, &p, R_V6_BLOCKED, 0);

	__u16 rule = 0;
	int act = lookup_rules(cfg, &p, &rule);
	if (act == ACT_ALLOW)
		return 1;
	if (act == ACT_DENY)
		return sock_deny(cfg, &p, R_RULE_DENY, rule);
	if (act == ACT_DENY_ALWAYS)
		return sock_refuse(cfg, &p, R_RULE_DENY, rule);
	if (act == ACT_DENY_AUDIT)
		return 1; // the TC program reports the would-drop
	if ((cfg->flags & CFG_L7) && p.proto == IPPROTO_TCP && (p.dport == 80 || p.dport == 443))
		return 1;
	if (learned(cfg, &p))
		return 1;
	if (cfg->flags & CFG_DEFAULT_ALLOW)
		return 1;
	return sock_deny(cfg, &p, R_DEFAULT_DENY, 0);
}

SEC("cgroup/connect4")
int airlock_connect4(struct bpf_sock_addr *ctx) { return sock_verdict(ctx, 0); }

SEC("cgroup/connect6")
int airlock_connect6(struct bpf_sock_addr *ctx) { return sock_verdict(ctx, 1); }

SEC("cgroup/sendmsg4")
int airlock_sendmsg4(struct bpf_sock_addr *ctx) { return sock_verdict(ctx, 0); }

SEC("cgroup/sendmsg6")
int airlock_sendmsg6(struct bpf_sock_addr *ctx) { return sock_verdict(ctx, 1); }

// ---- process attribution: cgroup/sock_ops ----
//
// A TCP connect's local port is picked after cgroup/connect runs; sock_ops'
// TCP_CONNECT_CB comes once it is (in tcp_connect, still in the connecting task), so
// the flow's full 5-tuple names the process for the TC program's first event. Unless
// record_only, the socket then asks for its state changes, and its entry is deleted
// when it reaches TCP_CLOSE (the TC program has named the process in every event of
// the flow by then): proc_by_flow holds the open connections, not the last 16 384
// connects, so a busy sandbox's short connections no longer evict the entry of a
// long-lived one, whose later records (count_flow) need it.
SEC("sockops")
int airlock_sockops(struct bpf_sock_ops *ctx)
{
	if (!attribute_procs)
		return 1;
	if (ctx->op != BPF_SOCK_OPS_TCP_CONNECT_CB &&
	    (ctx->op != BPF_SOCK_OPS_STATE_CB || ctx->args[1] != BPF_TCP_CLOSE))
		return 1;
	// local_port is in host order; remote_port holds the network-order port in its
	// upper 16 bits (the kernel loads skc_dport and shifts it).
	struct proc_key k = {.proto = IPPROTO_TCP, .lport = (__u16)ctx->local_port,
			     .rport = (__u16)bpf_ntohl(ctx->remote_port)};
	if (ctx->family == 2) { // AF_INET
		k.family = 4;
		map4(k.laddr, ctx->local_ip4);
		map4(k.raddr, ctx->remote_ip4);
	} else {
		__u32 *l = (__u32 *)k.laddr, *r = (__u32 *)k.raddr;
		l[0] = ctx->local_ip6[0];
		l[1] = ctx->local_ip6[1];
		l[2] = ctx->local_ip6[2];
		l[3] = ctx->local_ip6[3];
		r[0] = ctx->remote_ip6[0];
		r[1] = ctx->remote_ip6[1];
		r[2] = ctx->remote_ip6[2];
		r[3] = ctx->remote_ip6[3];
		// An IPv4-mapped peer leaves as IPv4.
		k.family = (r[0] == 0 && r[1] == 0 && r[2] == bpf_htonl(0xffff)) ? 4 : 6;
	}
	if (ctx->op == BPF_SOCK_OPS_STATE_CB) {
		bpf_map_delete_elem(&proc_by_flow, &k);
		return 1;
	}
	struct proc_info *pi = fill_proc();
	if (pi)
		bpf_map_update_elem(&proc_by_flow, &k, pi, BPF_ANY);
	if (!record_only)
		bpf_sock_ops_cb_flags_set(ctx, ctx->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
	return 1;
}
