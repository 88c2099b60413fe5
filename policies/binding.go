package policies

import (
	"fmt"
	"strings"
)

// bindingProbeLabel stands for "any name" under a wildcard binding host
// (*.example.com is covered when airlock-binding-probe.example.com is).
const bindingProbeLabel = "airlock-binding-probe"

// CoversBinding reports (nil) whether p lets a sandbox reach host:port over TCP by an
// explicit egress rule: a Credential Vault binding may only target what the policy
// allows, never something reached by the default action or in report mode. host is a
// name or a wildcard (*.example.com). A nil p (no policy) covers nothing. The error
// says why, without any value of a credential. lifecycle (airlock up) and egressd
// (the node API on Kubernetes) check bindings with it.
func CoversBinding(p *Policy, host string, port uint16) error {
	if p == nil {
		return fmt.Errorf("the sandbox has no networkPolicy: give it egress rules that allow %s", host)
	}
	d, err := Compile(p, CompileOptions{})
	if err != nil {
		return err
	}
	name := host
	if suffix, ok := strings.CutPrefix(host, "*."); ok {
		name = bindingProbeLabel + "." + suffix
	}
	dec := d.DecideName(name, port, TCP)
	if !dec.Allowed() || dec.WouldDeny || !strings.HasPrefix(dec.Rule, "egress[") {
		return fmt.Errorf("%s port %d is not allowed by an egress rule of the sandbox's networkPolicy (%s)", host, port, dec.Reason)
	}
	return nil
}
