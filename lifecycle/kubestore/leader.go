package kubestore

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LeaderEndpoint is where the leading replica is reached, published as the only
// endpoint of a Service without a selector (deploy/kubernetes/base/lifecycle.yaml:
// airlock-lifecycle-leader). The data plane (gateway, egressd) follows the watch stream
// through it: the leader publishes what it changes (a warm pool claim's policy) before
// its store write, where another replica learns it only after the write.
type LeaderEndpoint struct {
	// Service is the Service's name in Config.Namespace; the EndpointSlice of the same
	// name carries the leader's address. Empty: nothing is published.
	Service string
	// Address and Port are this replica's (the pod's IP, the API port).
	Address netip.Addr
	Port    int
	// Pod is this replica's pod, the endpoint's targetRef; empty: none.
	Pod string
}

// leaderManagedBy is the EndpointSlice's endpointslice.kubernetes.io/managed-by: not
// the EndpointSlice controller's, which leaves it alone for a Service without selector.
const leaderManagedBy = "airlock.dev-lifecycle"

// advertiseLeader points the leader Service's EndpointSlice at this replica while ctx
// (the leadership) lasts, retrying every RetryPeriod until it succeeds, and empties it
// when the leadership ends, unless another replica has taken it over meanwhile.
func (s *Store) advertiseLeader(ctx context.Context) {
	le := s.cfg.Leader
	if le.Service == "" || !le.Address.IsValid() {
		return
	}
	for {
		err := s.putLeaderSlice(ctx, &le)
		if err == nil {
			s.log.Info("leader endpoint published", "service", le.Service, "address", le.Address.String(), "port", le.Port)
			break
		}
		s.log.Error("publishing the leader endpoint failed; retrying", "service", le.Service, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.cfg.RetryPeriod):
		}
	}
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.putLeaderSlice(cctx, nil); err != nil {
		s.log.Warn("withdrawing the leader endpoint failed", "service", le.Service, "err", err)
	}
}

// putLeaderSlice makes the leader Service's EndpointSlice name le, or (le nil) name no
// endpoint when it still names this replica's address.
func (s *Store) putLeaderSlice(ctx context.Context, le *LeaderEndpoint) error {
	own := s.cfg.Leader
	slices := s.cfg.Client.DiscoveryV1().EndpointSlices(s.cfg.Namespace)
	cur, err := slices.Get(ctx, own.Service, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	want := s.leaderSlice(le)
	switch {
	case apierrors.IsNotFound(err):
		if le == nil {
			return nil
		}
		_, err = slices.Create(ctx, want, metav1.CreateOptions{})
	default:
		if le == nil && !(len(cur.Endpoints) == 1 && len(cur.Endpoints[0].Addresses) == 1 &&
			cur.Endpoints[0].Addresses[0] == own.Address.Unmap().String()) {
			return nil // another replica leads now
		}
		want.ResourceVersion = cur.ResourceVersion
		_, err = slices.Update(ctx, want, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("EndpointSlice %s/%s: %w", s.cfg.Namespace, own.Service, err)
	}
	return nil
}

// leaderSlice is the EndpointSlice naming le (nil: no endpoint).
func (s *Store) leaderSlice(le *LeaderEndpoint) *discoveryv1.EndpointSlice {
	own := s.cfg.Leader
	family := discoveryv1.AddressTypeIPv4
	if own.Address.Is6() && !own.Address.Is4In6() {
		family = discoveryv1.AddressTypeIPv6
	}
	name, proto, port := "http", corev1.ProtocolTCP, int32(own.Port)
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: own.Service, Namespace: s.cfg.Namespace,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: own.Service,
				discoveryv1.LabelManagedBy:   leaderManagedBy,
			},
		},
		AddressType: family,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
		Endpoints:   []discoveryv1.Endpoint{},
	}
	if le != nil {
		ready := true
		ep := discoveryv1.Endpoint{Addresses: []string{le.Address.Unmap().String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}}
		if le.Pod != "" {
			ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: s.cfg.Namespace, Name: le.Pod}
		}
		es.Endpoints = append(es.Endpoints, ep)
	}
	return es
}
