// Command deploy deploys Airlock on the one-node cluster of up.sh from its own manifests
// (internal/kubedeploy: kustomize, the API key Secret, server-side apply, rollouts) and
// prints the addresses and the API key the way `airlock up` does, then the operator
// README's SDK snippet filled in with them (kubedeploy.SDKSnippet; the node tests run
// the same). `make kube-up` runs it
// through airlock-up.sh, after importing the images. With -upstream-ca-file (airlock-up.sh's
// AIRLOCK_KUBE_UPSTREAM_CA, which the node tests set; `make kube-up` does not) egressd's
// DaemonSet also gets --upstream-ca-file naming that path in its pod, so this deployment
// alone trusts a test's HTTPS upstreams for intercepted (Credential Vault) requests.
//
// Usage: go run ./deploy/kubernetes/testenv/deploy [-kubeconfig FILE] [-k DIR] [-sandbox-image IMAGE] [-readme FILE] [-timeout D] [-upstream-ca-file PATH]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/airlockdev/airlock/internal/kubedeploy"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "/var/lib/airlock-kube/kubeconfig", "the cluster's admin kubeconfig")
	dir := flag.String("k", "deploy/kubernetes/overlays/testnode", "the kustomization to apply")
	sandboxImage := flag.String("sandbox-image", "airlock/sandbox:0.1.0", "the image the printed SDK example names")
	readme := flag.String("readme", "deploy/kubernetes/README.md", "the operator README whose SDK snippet is printed, filled in")
	timeout := flag.Duration("timeout", 5*time.Minute, "how long to wait for the rollouts")
	upstreamCA := flag.String("upstream-ca-file", "", "a PEM file, as egressd's pod sees it, added to egressd's --upstream-ca-file (empty: none)")
	flag.Parse()
	if err := run(*kubeconfig, *dir, *sandboxImage, *readme, *upstreamCA, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "deploy:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, dir, sandboxImage, readme, upstreamCA string, timeout time.Duration) error {
	doc, err := os.ReadFile(readme)
	if err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	m, err := kubedeploy.Render(dir)
	if err != nil {
		return err
	}
	if upstreamCA != "" {
		if err := m.AppendArgs("DaemonSet", "airlock-egressd", "--upstream-ca-file="+upstreamCA); err != nil {
			return err
		}
	}
	d, err := kubedeploy.New(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	began := time.Now()
	keys, err := d.Deploy(ctx, m, kubedeploy.SystemNamespace)
	if err != nil {
		return err
	}
	if err := d.WaitRollouts(ctx, m); err != nil {
		return err
	}
	api, err := d.NodePortAddr(ctx, kubedeploy.SystemNamespace, "airlock-lifecycle-nodeport")
	if err != nil {
		return err
	}
	gw, err := d.NodePortAddr(ctx, kubedeploy.SystemNamespace, "airlock-gateway")
	if err != nil {
		return err
	}
	// The NodePorts refuse connections until kube-proxy has the ready pods as endpoints.
	if err := kubedeploy.WaitServing(ctx, api, gw); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "==> Airlock deployed from %s and rolled out in %s\n", dir, time.Since(began).Round(100*time.Millisecond))
	w := os.Stdout
	fmt.Fprintf(w, "Airlock is up on the one-node cluster (%s).\n\n", kubeconfig)
	fmt.Fprintf(w, "  Lifecycle API: http://%s (NodePort of Service airlock-system/airlock-lifecycle-nodeport)\n", api)
	fmt.Fprintf(w, "  Gateway:       http://%s (NodePort; execd, the egress API and SDK clients: http://%s/sandboxes/<id>/proxy/<port>/)\n", gw, gw)
	fmt.Fprintf(w, "  Egress:        egressd DaemonSet airlock-system/airlock-egressd on the node\n")
	fmt.Fprintf(w, "  OPEN-SANDBOX-API-KEY: %s\n", keys.APIKey)
	js, err := kubedeploy.SDKSnippet(doc, api, keys.APIKey, sandboxImage)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\nOpenSandbox SDK (npm install @alibaba-group/opensandbox; %s, step 6):\n\n", readme)
	for l := range strings.SplitSeq(strings.TrimRight(js, "\n"), "\n") {
		fmt.Fprintf(w, "  %s\n", l)
	}
	fmt.Fprintln(w)
	return nil
}
