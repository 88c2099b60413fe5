package cluster

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/airlockdev/airlock/lifecycle"
)

// ParsePool reads one warm pool in the form of `airlock lifecycle --pool` (and the
// manifests' AIRLOCK_POOL setting): comma-separated key=value pairs, image and size
// required, name, cpu and memory optional, e.g.
// "name=py,image=registry.example.com/airlock/sandbox:1,size=2,cpu=500m,memory=512Mi".
// cpu and memory are the members' resource limits in create-request form; a create
// matches the pool only with the same image and limits. Errors name the bad pair.
// lifecycle.New checks the values (size 1 to 256, limits within the server's).
func ParsePool(s string) (lifecycle.PoolSpec, error) {
	var p lifecycle.PoolSpec
	for kv := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || v == "" {
			return p, fmt.Errorf("pool %q: %q is not key=value", s, kv)
		}
		switch k {
		case "name":
			p.Name = v
		case "image":
			p.Image = v
		case "size":
			n, err := strconv.Atoi(v)
			if err != nil {
				return p, fmt.Errorf("pool %q: size %q is not a number", s, v)
			}
			p.Size = n
		case "cpu", "memory":
			if p.ResourceLimits == nil {
				p.ResourceLimits = map[string]string{}
			}
			p.ResourceLimits[k] = v
		default:
			return p, fmt.Errorf("pool %q: unknown key %q (name, image, size, cpu, memory)", s, k)
		}
	}
	if p.Image == "" || p.Size == 0 {
		return p, fmt.Errorf("pool %q: image and size are required", s)
	}
	return p, nil
}
