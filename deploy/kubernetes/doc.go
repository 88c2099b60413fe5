// Package manifests holds Airlock's Kubernetes manifests: the kustomize base (base/)
// and the overlays single-namespace, gvisor and testnode (overlays/), documented in
// README.md.
// It has no Go API; its tests render every kustomization with kustomize's Go API,
// apply the result to a real kube-apiserver (server-side apply, dry run) and check
// each component's ServiceAccount with SubjectAccessReviews and by running a lifecycle
// replica as its ServiceAccount.
package manifests
