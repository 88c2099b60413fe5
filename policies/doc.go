// Package policies is Airlock's egress policy language: the declarative, versioned
// document that says what a sandbox may reach, its strict parser, the operator overlay,
// and the compiled decision function (docs/architecture.md#policies). README.md documents
// the format.
//
// The flow every consumer follows:
//
//	pol, err := policies.Parse("sandbox-42", raw) // YAML or JSON; Airlock form or OpenSandbox networkPolicy
//	d, err := policies.Compile(pol, policies.CompileOptions{Overlay: overlay, Version: rev})
//	dec := d.DecideName("pypi.org", 443, policies.TCP) // Decision{Action, Rule, Reason, ...}
//
// or policies.Load for both steps. egressd compiles each watch.Sandbox.Policy (raw JSON as
// lifecycle stores it, json.Marshal of a parsed Policy) with Version =
// Sandbox.PolicyVersion; an empty document is ErrEmpty and the operator's default policy
// applies instead. Parse is the one validation function shared by the
// CLI (`airlock policy validate`), lifecycle (create and PATCH/DELETE /policy) and
// egressd; its errors wrap ErrInvalid and carry source, line, column and reason (*Error).
//
// Semantics, in evaluation order:
//
//  1. Overlay always-deny (operator; enforced even in report mode).
//  2. Overlay always-allow (operator).
//  3. The policy's egress rules, first match wins. A rule matches when its target,
//     ports and protocols match. "*.example.com" matches names below example.com, not
//     example.com; "*"/"**" match everything.
//  4. The default action (deny unless the policy says allow).
//
// Special addresses (Classify: private, CGNAT, loopback, link-local, IPv4-mapped, ...)
// are reached only through an explicit IP/CIDR allow rule: catch-all allows, the default
// and names' DNS answers never reach them (DecideLearned), which defeats DNS rebinding.
// In audit mode (mode: audit on the policy, a deny rule or a deny HTTP rule; "report"
// is read as audit), a denial becomes Allow with WouldDeny set and Rule naming what
// would have denied; overlay denials and special addresses stay denied in every mode.
//
// A Decider is immutable and safe for concurrent use; a policy change compiles a new
// one. It exposes what datapaths need: IPRules (static prefixes with ports and
// protocols, for an LPM trie), DefaultAction, HasIPv6, L7, DNS (query types, limits,
// tunnelling guard), Mode, AuditLevel and Version. Decisions never perform I/O.
//
// The OpenSandbox egress API helpers (NetworkPolicy, ToNetworkPolicy, Patch,
// RemoveTargets, ParseRules, ParseTargets, Status) implement GET/PATCH/DELETE /policy
// semantics from docs/spec/egress-api.yaml.
package policies
