package lifecycle

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"path"
	"regexp"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/airlockdev/airlock/policies"
)

// Limits bound what a create request may ask for.
type Limits struct {
	// MinTimeout and MaxTimeout bound the create request's timeout; defaults 60 s (the
	// specification's minimum) and 24 h.
	MinTimeout, MaxTimeout time.Duration
	// MaxCPUs caps resourceLimits.cpu (default: this host's CPU count).
	MaxCPUs float64
	// DefaultPids is the pids limit when the request names none (default 4096).
	DefaultPids int64
}

func (l *Limits) setDefaults() {
	if l.MinTimeout <= 0 {
		l.MinTimeout = 60 * time.Second
	}
	if l.MaxTimeout <= 0 {
		l.MaxTimeout = 24 * time.Hour
	}
	if l.MaxCPUs <= 0 {
		l.MaxCPUs = float64(goruntime.NumCPU())
	}
	if l.DefaultPids <= 0 {
		l.DefaultPids = 4096
	}
}

// ExtRenewOnAccess is the extension key opting a sandbox into renew-on-access
// (OSEP-0009): a decimal number of seconds from 300 to 86400.
const ExtRenewOnAccess = "access.renew.extend.seconds"

// reservedPrefixes are metadata key prefixes that belong to platforms, not users.
var reservedPrefixes = []string{"opensandbox.io/", "airlock.dev/"}

var (
	labelName   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsSubdom   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	dnsLabel    = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	envName     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`)
	quantityRE  = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$`)
	quantityMul = map[string]*big.Rat{
		"": big.NewRat(1, 1), "m": big.NewRat(1, 1000),
		"k": big.NewRat(1e3, 1), "M": big.NewRat(1e6, 1), "G": big.NewRat(1e9, 1),
		"T": big.NewRat(1e12, 1), "P": big.NewRat(1e15, 1), "E": big.NewRat(1e18, 1),
		"Ki": big.NewRat(1<<10, 1), "Mi": big.NewRat(1<<20, 1), "Gi": big.NewRat(1<<30, 1),
		"Ti": big.NewRat(1<<40, 1), "Pi": big.NewRat(1<<50, 1), "Ei": big.NewRat(1<<60, 1),
	}
)

// ParseQuantity parses a Kubernetes-style quantity ("500m", "1", "0.5", "512Mi", "2Gi",
// "1G") into an exact rational number.
func ParseQuantity(s string) (*big.Rat, error) {
	m := quantityRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return nil, fmt.Errorf("%q is not a quantity (examples: 500m, 2, 512Mi, 2Gi)", s)
	}
	v, ok := new(big.Rat).SetString(m[1])
	if !ok {
		return nil, fmt.Errorf("%q is not a quantity", s)
	}
	return v.Mul(v, quantityMul[m[2]]), nil
}

// validateMetadataKey checks a Kubernetes label key: [prefix/]name, prefix a DNS
// subdomain of at most 253 octets, name at most 63 characters.
func validateMetadataKey(k string) error {
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(k, p) {
			return fmt.Errorf("%w: metadata key %q uses the reserved prefix %q", ErrInvalidRequest, k, p)
		}
	}
	name := k
	if i := strings.LastIndexByte(k, '/'); i >= 0 {
		prefix := k[:i]
		name = k[i+1:]
		if prefix == "" || len(prefix) > 253 || !dnsSubdom.MatchString(prefix) {
			return fmt.Errorf("%w: metadata key %q: prefix must be a DNS subdomain", ErrInvalidRequest, k)
		}
	}
	if name == "" || len(name) > 63 || !labelName.MatchString(name) {
		return fmt.Errorf("%w: metadata key %q: name must be 1-63 characters [A-Za-z0-9-_.], starting and ending alphanumeric", ErrInvalidRequest, k)
	}
	return nil
}

// validateMetadataValue checks a Kubernetes label value: empty, or up to 63 characters
// matching [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?.
func validateMetadataValue(k, v string) error {
	if v == "" {
		return nil
	}
	if len(v) > 63 || !labelName.MatchString(v) {
		return fmt.Errorf("%w: metadata value of %q: at most 63 characters [A-Za-z0-9-_.], starting and ending alphanumeric", ErrInvalidRequest, k)
	}
	return nil
}

func validateMetadata(md map[string]string) error {
	for k, v := range md {
		if err := validateMetadataKey(k); err != nil {
			return err
		}
		if err := validateMetadataValue(k, v); err != nil {
			return err
		}
	}
	return nil
}

// validated is a create request checked and normalised.
type validated struct {
	spec          Spec
	timeout       time.Duration // 0: manual cleanup
	policy        json.RawMessage
	renewOnAccess int
	limits        map[string]string
	// credentialProxy is credentialProxy.enabled: intercept for the Credential Vault.
	credentialProxy bool
}

// validateCreate checks a create request against the specification and l; every error
// wraps one of the 400 sentinels.
func validateCreate(req *CreateRequest, l Limits) (*validated, error) {
	restore := req.SnapshotID != ""
	if restore == (req.Image != nil) {
		return nil, fmt.Errorf("%w: give exactly one of image and snapshotId", ErrInvalidRequest)
	}
	var uri string
	var auth *ImageAuth
	if !restore {
		if strings.TrimSpace(req.Image.URI) == "" {
			return nil, fmt.Errorf("%w: image.uri is required", ErrInvalidRequest)
		}
		uri, auth = req.Image.URI, req.Image.Auth
		if strings.ContainsAny(uri, " \t\r\n") || len(uri) > 512 {
			return nil, fmt.Errorf("%w: image.uri %q is not an image reference", ErrInvalidRequest, uri)
		}
	}
	if len(req.Entrypoint) == 0 && !restore { // a restore without one keeps the snapshot's
		return nil, fmt.Errorf("%w: entrypoint is required (for example [\"tail\",\"-f\",\"/dev/null\"])", ErrInvalidRequest)
	}
	for _, a := range req.Entrypoint {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, fmt.Errorf("%w: entrypoint contains a NUL byte", ErrInvalidRequest)
		}
	}
	if len(req.Entrypoint) > 0 && req.Entrypoint[0] == "" {
		return nil, fmt.Errorf("%w: entrypoint[0] is empty", ErrInvalidRequest)
	}
	v := &validated{spec: Spec{
		Image:      uri,
		ImageAuth:  auth,
		Entrypoint: append([]string(nil), req.Entrypoint...),
		Env:        map[string]string{},
		Pids:       l.DefaultPids,
		Platform:   req.Platform,
	}}
	if req.Timeout != nil {
		t := time.Duration(*req.Timeout) * time.Second
		if *req.Timeout < int64(l.MinTimeout/time.Second) || t > l.MaxTimeout {
			return nil, fmt.Errorf("%w: timeout %d s is outside [%d, %d] seconds (omit it for manual cleanup)",
				ErrInvalidRequest, *req.Timeout, int64(l.MinTimeout/time.Second), int64(l.MaxTimeout/time.Second))
		}
		v.timeout = t
	}
	if req.Platform != nil {
		if req.Platform.OS != "linux" || req.Platform.Arch != goruntime.GOARCH {
			return nil, fmt.Errorf("%w: platform %s/%s cannot run here (this host runs linux/%s)",
				ErrInvalidRequest, req.Platform.OS, req.Platform.Arch, goruntime.GOARCH)
		}
	}
	if err := validateResources(req.ResourceLimits, l, &v.spec); err != nil {
		return nil, err
	}
	v.limits = req.ResourceLimits
	for k, val := range req.Env {
		if !envName.MatchString(k) {
			return nil, fmt.Errorf("%w: env name %q is invalid (letters, digits, _ . -; not starting with a digit)", ErrInvalidRequest, k)
		}
		if strings.IndexByte(val, 0) >= 0 {
			return nil, fmt.Errorf("%w: env %s contains a NUL byte", ErrInvalidRequest, k)
		}
		v.spec.Env[k] = val
	}
	if err := validateMetadata(req.Metadata); err != nil {
		return nil, err
	}
	if err := validateVolumes(req.Volumes); err != nil {
		return nil, err
	}
	v.spec.Volumes = req.Volumes
	if p := req.NetworkPolicy; len(p) > 0 && string(p) != "null" {
		if err := validatePolicy(p); err != nil {
			return nil, err
		}
		v.policy = append(json.RawMessage(nil), p...)
	}
	v.credentialProxy = req.CredentialProxy != nil && req.CredentialProxy.Enabled
	if s, ok := req.Extensions[ExtRenewOnAccess]; ok {
		n, err := strconv.Atoi(s)
		if err != nil || n < 300 || n > 86400 {
			return nil, fmt.Errorf("%w: extensions[%q] must be a whole number of seconds from 300 to 86400", ErrInvalidRequest, ExtRenewOnAccess)
		}
		v.renewOnAccess = n
	}
	if err := validateRuntimeExt(req.Extensions, &v.spec); err != nil {
		return nil, err
	}
	return v, nil
}

// validateResources reads cpu, memory and pids from resourceLimits into spec.
func validateResources(rl map[string]string, l Limits, spec *Spec) error {
	for k, s := range rl {
		q, err := ParseQuantity(s)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalidResources, k, err)
		}
		switch k {
		case "cpu":
			f, _ := q.Float64()
			if f < 0.01 || f > l.MaxCPUs {
				return fmt.Errorf("%w: cpu %q is outside [10m, %g]", ErrInvalidResources, s, l.MaxCPUs)
			}
			spec.NanoCPUs = int64(math.Round(f * 1e9))
		case "memory":
			f, _ := q.Float64()
			if f < 6<<20 || f > 1<<50 {
				return fmt.Errorf("%w: memory %q is outside [6Mi, 1Pi]", ErrInvalidResources, s)
			}
			spec.MemoryBytes = int64(f)
		case "pids":
			if !q.IsInt() || q.Sign() <= 0 || q.Num().Int64() > 1<<22 {
				return fmt.Errorf("%w: pids %q must be a whole number from 1 to 4194304", ErrInvalidResources, s)
			}
			spec.Pids = q.Num().Int64()
		default:
			return fmt.Errorf("%w: %q is not supported (cpu, memory, pids)", ErrInvalidResources, k)
		}
	}
	return nil
}

// validateVolumes checks the shape of volumes; host-path permissions are the runtime's
// (it knows the allowed roots and resolves symlinks).
func validateVolumes(vols []Volume) error {
	names := map[string]bool{}
	mounts := map[string]bool{}
	for i, vol := range vols {
		if !dnsLabel.MatchString(vol.Name) || len(vol.Name) > 63 {
			return fmt.Errorf("%w: volumes[%d].name %q must be a DNS label", ErrInvalidVolume, i, vol.Name)
		}
		if names[vol.Name] {
			return fmt.Errorf("%w: volume name %q is used twice", ErrInvalidVolume, vol.Name)
		}
		names[vol.Name] = true
		backends := 0
		if vol.Host != nil {
			backends++
		}
		if vol.PVC != nil {
			backends++
		}
		if len(vol.OSSFS) > 0 && string(vol.OSSFS) != "null" {
			return fmt.Errorf("%w: volume %q: the ossfs backend is not supported", ErrInvalidVolume, vol.Name)
		}
		if backends != 1 {
			return fmt.Errorf("%w: volume %q must have exactly one backend (host or pvc)", ErrInvalidVolume, vol.Name)
		}
		mp := vol.MountPath
		if !strings.HasPrefix(mp, "/") || path.Clean(mp) != mp || mp == "/" || strings.HasPrefix(mp, "/opt/airlock") ||
			mp == "/proc" || strings.HasPrefix(mp, "/proc/") || mp == "/sys" || strings.HasPrefix(mp, "/sys/") || mp == "/dev" || strings.HasPrefix(mp, "/dev/") {
			return fmt.Errorf("%w: volume %q: mountPath %q must be a clean absolute path outside /, /proc, /sys, /dev and /opt/airlock", ErrInvalidVolume, vol.Name, mp)
		}
		if mounts[mp] {
			return fmt.Errorf("%w: mountPath %q is used twice", ErrInvalidVolume, mp)
		}
		mounts[mp] = true
		if sp := vol.SubPath; sp != "" {
			if strings.HasPrefix(sp, "/") || path.Clean(sp) != sp || sp == ".." || strings.HasPrefix(sp, "../") {
				return fmt.Errorf("%w: volume %q: subPath %q must be a relative path without ..", ErrInvalidVolume, vol.Name, sp)
			}
		}
		if vol.Host != nil {
			p := vol.Host.Path
			if !strings.HasPrefix(p, "/") || strings.Contains(p, "\x00") {
				return fmt.Errorf("%w: volume %q: host.path %q must be an absolute path", ErrInvalidVolume, vol.Name, p)
			}
		}
		if vol.PVC != nil {
			if !dnsLabel.MatchString(vol.PVC.ClaimName) || len(vol.PVC.ClaimName) > 253 {
				return fmt.Errorf("%w: volume %q: pvc.claimName %q must be a DNS label", ErrInvalidVolume, vol.Name, vol.PVC.ClaimName)
			}
		}
	}
	return nil
}

// validatePolicy checks a create request's networkPolicy with policies.Parse, the one
// validation function the CLI, lifecycle and egressd share (OpenSandbox
// {defaultAction, egress:[{action, target}]} or the Airlock form).
// policyHasHTTP reports whether raw (a validated networkPolicy; nil: none) has HTTP
// rules.
func policyHasHTTP(raw json.RawMessage) bool {
	if len(raw) == 0 {
		return false
	}
	p, err := policies.Parse("networkPolicy", raw)
	return err == nil && p.HasHTTP()
}

func validatePolicy(raw json.RawMessage) error {
	if _, err := policies.Parse("networkPolicy", raw); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
	}
	return nil
}
