// Package conformance holds the runtime conformance suite: the same lifecycle API
// tests run against every runtime (Docker with the bbolt store; Kubernetes with the
// cluster store on a real kube-apiserver, its pods backed by real Docker containers
// through internal/kubetest's test kubelet), so that the OpenSandbox SDKs see one
// behaviour whatever runs the sandboxes. It has no non-test code.
package conformance
