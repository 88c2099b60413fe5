package docker

// BundleReads is how many times r read an image's trust bundle out of a container.
func BundleReads(r *Runtime) int {
	r.bundles.mu.Lock()
	defer r.bundles.mu.Unlock()
	return r.bundles.reads
}
